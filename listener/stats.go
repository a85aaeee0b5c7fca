package listener

import (
	"sync/atomic"
	"time"

	"github.com/amqpretry/amqpretry/internal/errtext"
)

// Stats is a snapshot of a Listener's state.
type Stats struct {
	// Consumers is how many handlers may run at once now (Spring's
	// concurrent consumers): between WithConcurrentConsumers and
	// WithMaxConcurrentConsumers while consuming, 1 while the queue's order
	// must hold, 0 while not consuming. Channels is how many AMQP channels
	// carry its deliveries, each with its own basic.consume: what the
	// broker's consumer list shows for the listener.
	Consumers int
	Channels  int
	// What the listener holds from the broker, which is what the broker
	// counts unacknowledged on its channels (with WithAckCoalescing, plus
	// AcksPending): InFlight = Prefetched + Running + Parked.
	//
	// Prefetched arrived and has not started: queued behind the handlers
	// (the prefetch at work), waiting for a handler slot, or collected for
	// a batch that has not started. Running is in a handler now (in batch
	// mode, the deliveries of the batches running). Parked is neither:
	// between attempts (a backoff, a recoverer's publish, a requeue delay),
	// holding no handler slot.
	InFlight   int
	Prefetched int
	Running    int
	Parked     int
	// AcksPending counts handled deliveries whose ack waits to be written
	// with others' (WithAckCoalescing): settled here, still unacknowledged
	// at the broker until it is.
	AcksPending int
	Handled     uint64 // acked: the chain returned nil (Recovered included); with WithAckCoalescing, as the acks are written
	Failed      uint64 // chain returned an error: requeued or rejected
	Requeued    uint64
	Rejected    uint64
	// Recovered counts deliveries acked because the chain's recoverer put
	// them somewhere else (a DLQ, a broker-side retry tier, a recoverer of
	// your own); DeadLettered, those of them that went there for good: all
	// but the hops to another try (the tiers, middleware.RetryScheduled).
	// Each dead letter is also logged, once, at warning level.
	Recovered    uint64
	DeadLettered uint64
	// OldestInFlight is how long ago the oldest delivery in flight arrived:
	// RabbitMQ closes the channel of one unsettled past its
	// consumer_timeout, and the listener warns at 80% of it. The others are
	// the same for the oldest of each state (0 when none is in it):
	// OldestPrefetched, how long the oldest waiting to start has waited.
	OldestInFlight   time.Duration
	OldestPrefetched time.Duration
	OldestRunning    time.Duration
	OldestParked     time.Duration
	// KillSwitch is the kill switch's state: "closed" (consuming),
	// "tripped" or "probing"; "" without WithKillSwitch.
	KillSwitch string

	// Ready: consuming with the concurrent consumers (see WaitReady), for a
	// readiness probe. ConnectedSince is when the current connection was
	// made, zero while there is none; LastConnectionError the last
	// connection, declaration or consume problem, "" if none yet.
	Ready               bool
	ConnectedSince      time.Time
	LastConnectionError string
}

type counters struct {
	handled, failed, requeued, rejected, recovered, deadLettered atomic.Uint64
}

// Stats returns a snapshot of the consumers and counters.
func (l *Listener) Stats() Stats {
	s := Stats{
		Handled:  l.stats.handled.Load(),
		Failed:   l.stats.failed.Load(),
		Requeued: l.stats.requeued.Load(),
		Rejected: l.stats.rejected.Load(),

		Recovered:    l.stats.recovered.Load(),
		DeadLettered: l.stats.deadLettered.Load(),
	}
	if l.killSwitch != nil {
		state, _, _ := l.killSwitch.current()
		s.KillSwitch = state.String()
	}
	l.ready.mu.Lock()
	s.Ready, s.ConnectedSince = l.ready.ready, l.ready.connectedSince
	if l.ready.lastErr != nil {
		s.LastConnectionError = errtext.String(l.ready.lastErr)
	}
	l.ready.mu.Unlock()
	oldest := noArrivals()
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.consumers {
		if c.consuming.Load() {
			s.Channels++
		}
		c.arrivals(&oldest)
		ahead, _ := c.ahead.aheadStats()
		inFlight, running, waiting := int(c.inFlight.Load()), int(c.running.Load()), int(c.waiting.Load())
		if c.b != nil {
			waiting += int(c.b.collecting.Load()) // read, waiting for their batch to fill
		}
		s.Prefetched += ahead + waiting
		s.Running += running
		s.Parked += max(inFlight-running-waiting, 0)
		s.AcksPending += c.acks.pending()
	}
	s.InFlight = s.Prefetched + s.Running + s.Parked
	now := monotime() // after every arrival looked at
	s.OldestInFlight = age(now, oldest.inFlight)
	s.OldestPrefetched = age(now, oldest.prefetched)
	s.OldestRunning = age(now, oldest.running)
	s.OldestParked = age(now, oldest.parked)
	if s.Channels > 0 {
		s.Consumers = int(l.pool.limit.Load())
	}
	return s
}
