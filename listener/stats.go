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
	InFlight  int    // received and not settled yet
	Running   int    // in a handler now (in batch mode, the deliveries of the batches running)
	Parked    int    // in flight but neither running nor queued for a consumer: waiting between retries
	Handled   uint64 // acked: the chain returned nil (Recovered included); with WithAckCoalescing, as the acks are written
	Failed    uint64 // chain returned an error: requeued or rejected
	Requeued  uint64
	Rejected  uint64
	// Recovered counts deliveries acked because the chain's recoverer put
	// them somewhere else (a DLQ, a broker-side retry tier, a recoverer of
	// your own); DeadLettered, those of them that went there for good: all
	// but the hops to another try (the tiers, middleware.RetryScheduled).
	// Each dead letter is also logged, once, at warning level.
	Recovered    uint64
	DeadLettered uint64
	// OldestInFlight is how long the oldest delivery in flight has been in
	// the listener's hands; RabbitMQ closes the channel of one unsettled past
	// its consumer_timeout, and the listener warns at 80% of it.
	OldestInFlight time.Duration
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
	now := monotime()
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.consumers {
		s.OldestInFlight = max(s.OldestInFlight, c.oldest(now))
		if c.consuming.Load() {
			s.Channels++
		}
		inFlight, running, waiting := int(c.inFlight.Load()), int(c.running.Load()), int(c.waiting.Load())
		if c.b != nil {
			waiting += int(c.b.collecting.Load()) // read, waiting for their batch to fill
		}
		s.InFlight += inFlight
		s.Running += running
		s.Parked += max(inFlight-running-waiting, 0)
	}
	if s.Channels > 0 {
		s.Consumers = int(l.pool.limit.Load())
	}
	return s
}
