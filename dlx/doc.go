// Package dlx lays out dead-lettering and broker-side retries for a work queue
// and reads what RabbitMQ writes about them: declare a Topology, recover with
// its Tiers, move dead letters back with Replay.
//
// Tiers and Replay publish through a recoverer.Publisher (*publisher.Publisher
// is one).
//
// Invalid options that cannot depend on the broker panic at construction,
// naming every bad option; what depends on the broker is an error at run
// time. Validate reports every problem with a Topology, each with its field
// and value; Tiers and RejectToRetry panic with all of them (and Tiers with
// every bad MaxRetries or WithRepublishOptions value too), since no broker
// can make a wrong Topology right. Declare, which talks to the broker, returns
// them as an error, as it does a declaration the broker refuses.
package dlx
