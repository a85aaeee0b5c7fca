// Package dlx lays out dead-lettering and broker-side retries for a work queue
// and reads what RabbitMQ writes about them: declare a Topology, recover with
// its Tiers, move dead letters back with Replay.
//
// Tiers and Replay publish through a recoverer.Publisher (*publisher.Publisher
// is one). Validate reports every problem with a Topology at once; Tiers and
// RejectToRetry panic with all of them, since no broker can make a wrong
// Topology right, while Declare returns them as an error.
package dlx
