// Package dlx lays out dead-lettering and broker-side retries for a work queue
// and reads what RabbitMQ writes about them: declare a Topology, recover with
// its Tiers, move dead letters back with Replay.
//
// Tiers and Replay publish through a recoverer.Publisher (*publisher.Publisher
// is one).
//
// Topology.SingleActiveConsumer gives the work queue single active consumer
// (x-single-active-consumer), and only the work queue: the broker delivers
// to one of its consumers at a time and, when that one goes, to the next,
// starting with what the one that went left unacked. Run one listener with
// one consumer in each of several processes for failover; a listener that
// declares the queue through listener.WithDeclare(topo.Declare) knows the
// queue is single-active and does not scale up on it. The retry queues have
// no consumers and the DLQ is read with basic.get, so neither gets it. It is
// one consumer at a time, not one order across failures: a retry through a
// tier or DelayedRedelivery comes back behind later messages, and a
// delivery waiting between local retries lets the rest of the prefetch pass
// (see the field for what keeps queue order).
//
// Invalid options that cannot depend on the broker panic at construction,
// naming every bad option; what depends on the broker is an error at run
// time. Validate reports every problem with a Topology, each with its field
// and value; Tiers and RejectToRetry panic with all of them (and Tiers with
// every bad MaxRetries or WithRepublishOptions value too), since no broker
// can make a wrong Topology right. Declare, which talks to the broker, returns
// them as an error, as it does a declaration the broker refuses.
package dlx
