package listener_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// A downstream outage: every delivery fails. Without a kill switch the
// chain exhausts its retries and sends the whole queue to the DLQ. With one,
// the listener trips after a few failures, stops consuming (the broker shows
// no consumer and the messages stay on the queue), probes after the restart
// timeout, backs off while the outage lasts, and once it ends consumes
// everything: the few failures before the trip on the DLQ, the rest handled.
func TestKillSwitchStopsConsumingDuringAnOutage(t *testing.T) {
	t.Parallel()
	const n = 200
	tests := []struct {
		name       string
		killSwitch bool
		coalesce   bool // WithAckCoalescing: a trip writes the acks that wait; the probe, at prefetch 1, acks each at once
	}{
		{"without", false, false},
		{"with", true, false},
		{"with acks coalesced", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
			brokertest.Queue(t, q, nil)
			brokertest.Queue(t, dlq, nil)
			pub, err := publisher.New(brokertest.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			var down atomic.Bool
			down.Store(true)
			chain := middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(10*time.Millisecond)),
				middleware.Recover(recoverer.Republish(pub, "", dlq)))
			handle := func(context.Context, *amqp.Delivery) error {
				if down.Load() {
					return errors.New("database unavailable")
				}
				return nil
			}
			var log testlog.Buffer
			o := observe(t)
			opts := append(o.options(), listener.WithPrefetch(10), listener.WithLogger(log.Logger()))
			if tt.killSwitch {
				opts = append(opts, listener.WithKillSwitch(listener.KillSwitch{
					TripThreshold: 0.5, ActivationThreshold: 5, TrackingPeriod: 10 * time.Second, RestartTimeout: 200 * time.Millisecond}))
			}
			if tt.coalesce {
				opts = append(opts, listener.WithAckCoalescing(5, 20*time.Millisecond))
			}
			publishN(t, q, n)
			r := start(t, q, chain, handle, opts...)
			if !tt.killSwitch {
				brokertest.Eventually(t, 30*time.Second, "every message settled", func() bool { return r.Stats().Handled == n })
				r.Stop(t)
				if got := brokertest.Depth(t, dlq); got != n {
					t.Errorf("without a kill switch the DLQ holds %d, want all %d", got, n)
				}
				return
			}
			brokertest.Eventually(t, 10*time.Second, "the kill switch tripped", func() bool { return log.Count("kill switch tripped") > 0 })
			brokertest.Eventually(t, 10*time.Second, "no consumer on the queue", func() bool { return brokertest.Consumers(t, q) == 0 })
			if st := r.Stats().KillSwitch; st != "tripped" && st != "probing" {
				t.Errorf("Stats().KillSwitch = %q while tripped", st)
			}
			if got := brokertest.Depth(t, q); got < n/2 {
				t.Errorf("only %d of %d messages wait on the queue while tripped", got, n)
			}
			// The outage lasts through a probe or more.
			brokertest.Eventually(t, 10*time.Second, "a probe", func() bool { return log.Count("probing with one consumer") > 0 })
			down.Store(false)
			brokertest.Eventually(t, 30*time.Second, "every message settled", func() bool { return r.Stats().Handled == n })
			r.Stop(t)
			dead := brokertest.Depth(t, dlq)
			t.Logf("%d on the DLQ, %d trips, %d probes", dead, log.Count("kill switch tripped"), log.Count("probing with one consumer"))
			// Failures are counted as they go to the recoverer: those before
			// the one that trips it (fewer than ActivationThreshold, 5, when
			// all fail) are dead-lettered; that one and every later one go
			// back to the queue, but for the message of each failed probe,
			// which goes on to the recoverer (so that a poison message does
			// not fail every probe).
			failedProbes := log.Count("kill switch tripped") - 1
			if dead >= 5+failedProbes {
				t.Errorf("the DLQ holds %d of %d, want fewer than the ActivationThreshold plus one per failed probe (%d): the trip did not keep the outage from dead-lettering", dead, n, failedProbes)
			}
			if brokertest.Depth(t, q) != 0 {
				t.Errorf("the queue still holds %d", brokertest.Depth(t, q))
			}
			if st := r.Stats().KillSwitch; st != "closed" {
				t.Errorf("Stats().KillSwitch = %q after the outage, want closed", st)
			}
			if trips := o.sum(t, "amqpretry.killswitch.trips"); trips < 1 || int(trips) != log.Count("kill switch tripped") {
				t.Errorf("amqpretry.killswitch.trips = %d, want the %d trips logged", trips, log.Count("kill switch tripped"))
			}
			if log.Count("kill switch probe succeeded") == 0 {
				t.Error("no probe succeeded")
			}
		})
	}
}

// Once the kill switch has tripped, a delivery still in flight that fails
// for good on a chain without Recover goes back to its queue (a nack), not to
// the queue's dead-letter exchange: only the failures before the trip are
// dead-lettered, and nothing is lost.
func TestKillSwitchTrippedSendsNoRejectionToTheDLX(t *testing.T) {
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, dlq, nil)
	brokertest.Queue(t, q, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	const n, activation = 40, 5
	var log testlog.Buffer
	handle := func(ctx context.Context, _ *amqp.Delivery) error {
		select {
		case <-time.After(200 * time.Millisecond): // four in flight at once, finishing together
		case <-ctx.Done():
		}
		return middleware.Permanent(errors.New("the downstream refuses everything"))
	}
	publishN(t, q, n)
	r := start(t, q, nil, handle, listener.WithConcurrentConsumers(4), listener.WithPrefetch(1), listener.WithLogger(log.Logger()),
		listener.WithKillSwitch(listener.KillSwitch{TripThreshold: 1, ActivationThreshold: activation, TrackingPeriod: 10 * time.Second, RestartTimeout: time.Hour}))
	brokertest.Eventually(t, 10*time.Second, "the kill switch tripped", func() bool { return log.Count("kill switch tripped") > 0 })
	brokertest.Eventually(t, 10*time.Second, "nothing in flight", func() bool { return r.Stats().InFlight == 0 })
	r.Stop(t)
	dead, left := brokertest.Depth(t, dlq), brokertest.Depth(t, q)
	if dead >= activation {
		t.Errorf("the DLQ holds %d, want fewer than the %d failures that trip the switch: deliveries that failed after the trip were rejected to the DLX", dead, activation)
	}
	if dead+left != n {
		t.Errorf("%d dead-lettered + %d on the queue = %d, want all %d", dead, left, dead+left, n)
	}
}

// A poison message at the head of the queue must not fail every probe: the
// probe's failure trips the switch again, and its message goes on to the
// recoverer (the DLQ, with its reason) rather than back to the head, so the
// next probe takes the next message. Two poison messages ahead of ten
// healthy ones: both end on the DLQ after a probe each, and the healthy ones
// are handled.
func TestKillSwitchProbeDoesNotRetakeAPoisonMessageForEver(t *testing.T) {
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, q, nil)
	brokertest.Queue(t, dlq, nil)
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var poisonCalls atomic.Int64
	handle := func(_ context.Context, d *amqp.Delivery) error {
		if d.MessageId == "p1" || d.MessageId == "p2" {
			poisonCalls.Add(1)
			return errors.New("cannot parse the order")
		}
		return nil
	}
	msgs := []amqp.Publishing{{MessageId: "p1"}, {MessageId: "p2"}}
	for i := range 10 {
		msgs = append(msgs, amqp.Publishing{MessageId: string(rune('a' + i))})
	}
	brokertest.Publish(t, q, msgs...)
	var log testlog.Buffer
	r := start(t, q, middleware.Recover(recoverer.Republish(pub, "", dlq)), handle, listener.WithPrefetch(1), listener.WithLogger(log.Logger()),
		listener.WithKillSwitch(listener.KillSwitch{TripThreshold: 0.5, ActivationThreshold: 1, TrackingPeriod: 10 * time.Second,
			RestartTimeout: 100 * time.Millisecond, MaxRestartTimeout: 200 * time.Millisecond}))
	brokertest.Eventually(t, 15*time.Second, "the ten healthy messages handled", func() bool {
		st := r.Stats() // one snapshot: Recovered read after Handled may be the larger, and the difference would wrap
		return st.Handled >= st.Recovered+10
	})
	r.Stop(t)
	if got := drain(t, dlq); len(got) != 2 || got[0] != "p1" || got[1] != "p2" {
		t.Errorf("the DLQ holds %v, want [p1 p2]", got)
	}
	if n := poisonCalls.Load(); n > 3 {
		t.Errorf("the poison messages were handled %d times, want 3: p1 once before the trip and once as a probe, p2 once as a probe", n)
	}
	if d := brokertest.Depth(t, q); d != 0 {
		t.Errorf("the queue still holds %d", d)
	}
}
