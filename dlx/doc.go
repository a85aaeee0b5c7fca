// Package dlx lays out dead-lettering and broker-side retries for a work queue
// and reads what RabbitMQ writes about them: declare a Topology, recover with
// its Tiers, move dead letters back with Replay.
package dlx
