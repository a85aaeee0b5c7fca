package listener

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// KillSwitch stops consuming while most deliveries fail for good, as during
// a downstream outage, instead of sending the whole queue to the DLQ; it is
// MassTransit's kill switch. See WithKillSwitch. A zero field takes its
// default.
type KillSwitch struct {
	// TripThreshold is the share of the deliveries ended in the tracking
	// period that failed for good at which it trips, above 0 and at most 1.
	// Default 0.15 (MassTransit's).
	TripThreshold float64
	// ActivationThreshold is how many deliveries must have ended in the
	// tracking period before it may trip. Default 10 (MassTransit's).
	ActivationThreshold int
	// TrackingPeriod is the sliding window. Default 1m.
	TrackingPeriod time.Duration
	// RestartTimeout is how long it stays tripped before a probe; it
	// doubles each time a probe fails, up to MaxRestartTimeout. Default 1m
	// (MassTransit's), max 10m.
	RestartTimeout    time.Duration
	MaxRestartTimeout time.Duration
	// IgnorePermanent leaves Permanent errors (bad messages, not an outage)
	// out of the failures; they still count as activity.
	IgnorePermanent bool
}

// WithKillSwitch stops the listener consuming when, over the last
// TrackingPeriod, at least ActivationThreshold deliveries ended and the share
// of them that failed for good (retries exhausted, Permanent, a recoverer
// that failed, a requeue after a failure) reaches TripThreshold. A failure
// that goes to a recoverer is counted just before it would: the one that
// trips the switch, and every one after it, goes back to the queue instead.
// It cancels its consumers: deliveries in flight finish, but none of theirs
// reaches the recoverer any more and their waits end, so they go back to the
// queue (a nack, which RabbitMQ 4.3 does not count as a delivery) rather
// than to the DLQ. Messages stay on the queue while it is tripped. After RestartTimeout
// it consumes again with one consumer at prefetch 1, a probe: the first
// delivery that succeeds resets the window and brings the other consumers
// back; one that fails trips it again, with the timeout doubled, and goes on
// to its recoverer (or is settled as the chain says) as it would with the
// switch closed, so that the next probe takes the next message: a poison
// message at the head of the queue costs one probe, not every probe.
//
// Off by default.
func WithKillSwitch(ks KillSwitch) Option {
	return func(c *config) {
		if ks.TripThreshold == 0 {
			ks.TripThreshold = 0.15
		}
		if ks.ActivationThreshold == 0 {
			ks.ActivationThreshold = 10
		}
		if ks.TrackingPeriod == 0 {
			ks.TrackingPeriod = time.Minute
		}
		if ks.RestartTimeout == 0 {
			ks.RestartTimeout = time.Minute
		}
		if ks.MaxRestartTimeout == 0 {
			ks.MaxRestartTimeout = max(10*time.Minute, ks.RestartTimeout)
		}
		switch {
		case !(ks.TripThreshold > 0 && ks.TripThreshold <= 1):
			c.fail("WithKillSwitch expects a TripThreshold above 0 and at most 1, got %v", ks.TripThreshold)
		case ks.ActivationThreshold < 1:
			c.fail("WithKillSwitch expects an ActivationThreshold of at least 1, got %d", ks.ActivationThreshold)
		case ks.TrackingPeriod < time.Second:
			c.fail("WithKillSwitch expects a TrackingPeriod of at least 1s, got %v", ks.TrackingPeriod)
		case ks.RestartTimeout < 0 || ks.MaxRestartTimeout < ks.RestartTimeout:
			c.fail("WithKillSwitch expects 0 < RestartTimeout <= MaxRestartTimeout, got %v, %v", ks.RestartTimeout, ks.MaxRestartTimeout)
		}
		c.killSwitch = &ks
	}
}

// Kill switch states.
type switchState int

const (
	switchClosed  switchState = iota // consuming, counting
	switchTripped                    // not consuming until the restart time
	switchProbing                    // one consumer, waiting for a first outcome
)

func (s switchState) String() string {
	return [...]string{"closed", "tripped", "probing"}[s]
}

// killSwitch is the state machine. Outcomes arrive from every consumer's
// goroutines; the session asks it what to do on its ticks.
//
// It is ours, about a hundred lines, not a circuit-breaker library's.
// sony/gobreaker v2.4.0 was the candidate: go 1.22, no dependency outside
// its tests, a rolling window (BucketPeriod), ReadyToTrip over its counts for
// the trip threshold and minimum activity, and a two-step API for outcomes
// reported after the fact. failsafe-go v0.9.8's circuit breaker needs go
// 1.22 too but brings gRPC and protobuf into the module graph. We use
// neither: the core module's dependencies are a closed list (amqp091-go,
// backoff/v4, OpenTelemetry), gobreaker's open state has one fixed Timeout
// where the kill switch backs off, and what matters here, stopping consumers
// and keeping in-flight deliveries from the recoverer, is the listener's
// either way.
type killSwitch struct {
	cfg KillSwitch

	mu        sync.Mutex
	state     switchState
	buckets   [killSwitchBuckets]bucket // the tracking period, a ring
	width     time.Duration             // of one bucket
	trips     int                       // in a row, for the restart backoff
	resumeAt  time.Time
	tripped   chan struct{} // a signal to the session: stop consuming now
	lastTrip  string        // why, for the log
	probeDone chan struct{} // a signal: the probe succeeded
}

const killSwitchBuckets = 20

type bucket struct {
	start         time.Time
	ended, failed int
}

func newKillSwitch(cfg KillSwitch) *killSwitch {
	return &killSwitch{cfg: cfg, width: cfg.TrackingPeriod / killSwitchBuckets,
		tripped: make(chan struct{}, 1), probeDone: make(chan struct{}, 1)}
}

// outcome is how a delivery ended, for the kill switch.
type outcome int

const (
	succeeded outcome = iota // handled, or recovered without failing for good
	failed                   // failed for good
	// ignored: failed for good, but of a kind the switch leaves out
	// (Permanent, with IgnorePermanent): activity while it counts, and no
	// verdict on a probe, since a bad message says nothing of an outage.
	ignored
)

// record counts one delivery's end and reports whether it tripped the
// switch, and whether it was the probe's failure (which trips it again).
func (k *killSwitch) record(now time.Time, o outcome) (tripped, probeFailed bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch k.state {
	case switchTripped:
		return false, false // deliveries in flight finishing: they decide nothing
	case switchProbing:
		switch o {
		case ignored:
			return false, false // the probe goes on with the next delivery
		case failed:
			k.trip(now, "the probe failed")
			return true, true
		}
		k.state = switchClosed
		k.trips = 0
		k.buckets = [killSwitchBuckets]bucket{}
		signal(k.probeDone)
		return false, false
	}
	b := &k.buckets[(now.UnixNano()/int64(k.width))%killSwitchBuckets]
	if now.Sub(b.start) >= k.width {
		*b = bucket{start: now.Truncate(k.width)}
	}
	b.ended++
	if o == failed {
		b.failed++
	}
	var ended, fails int
	for _, b := range k.buckets {
		if now.Sub(b.start) < k.cfg.TrackingPeriod {
			ended += b.ended
			fails += b.failed
		}
	}
	if ended >= k.cfg.ActivationThreshold && float64(fails) >= k.cfg.TripThreshold*float64(ended) {
		k.trip(now, fmt.Sprintf("%d of the %d deliveries that ended in the last %v failed (TripThreshold %v)", fails, ended, k.cfg.TrackingPeriod, k.cfg.TripThreshold))
		return true, false
	}
	return false, false
}

// stopAllConsumers is the trip, at once, from the delivery that tripped it:
// every consumer stops and its deliveries' waits end, so that none more
// reaches the recoverer while the session gets the signal.
func (l *Listener) stopAllConsumers() {
	l.mu.Lock()
	all := make([]*consumer, 0, len(l.consumers))
	for c := range l.consumers {
		all = append(all, c)
	}
	l.mu.Unlock()
	for _, c := range all {
		c.interruptWaits()
		c.stop()
		l.pool.forgive(&c.slots) // the probe must not wait for a handler that hangs
	}
}

// trip opens the switch, under mu.
func (k *killSwitch) trip(now time.Time, why string) {
	timeout := time.Duration(math.Min(float64(k.cfg.RestartTimeout)*math.Pow(2, float64(k.trips)), float64(k.cfg.MaxRestartTimeout)))
	k.trips++
	k.state = switchTripped
	k.resumeAt = now.Add(timeout)
	k.lastTrip = why
	signal(k.tripped)
}

// probeDue moves a tripped switch whose restart time has come to probing.
func (k *killSwitch) probeDue(now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.state == switchTripped && !now.Before(k.resumeAt) {
		k.state = switchProbing
		return true
	}
	return false
}

func (k *killSwitch) current() (switchState, time.Time, string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.state, k.resumeAt, k.lastTrip
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// errTripped is why a delivery that failed for good went back to its queue
// rather than to its recoverer.
var errTripped = errors.New("listener: the kill switch has tripped; the message goes back to the queue")

// recordFailure counts dd's failure for good before its recoverer runs, and
// says whether the recovery may go on: not once the switch has tripped.
func (l *Listener) recordFailure(dd *delivery, cause error) error {
	ks := l.killSwitch
	if ks == nil {
		return nil
	}
	if l.cfg.killSwitch.IgnorePermanent && middleware.IsPermanent(cause) {
		return nil // counted as activity when it ends
	}
	r := dd.recovery()
	r.recorded = true
	tripped, probeFailed := ks.record(time.Now(), failed)
	if tripped {
		l.stopAllConsumers()
	}
	if probeFailed {
		// The probe's own failure goes on to the recoverer, as it would
		// with the switch closed: handed back, it would be at the head of
		// the queue again for the next probe, and one poison message would
		// keep the switch tripped for ever.
		r.probeFailed = true
		return nil
	}
	if state, _, _ := ks.current(); state != switchClosed {
		return errTripped
	}
	return nil
}

// classify tells a delivery's end to the kill switch: counted is false for
// a release (shutdown, an interrupted wait, the trip itself).
func (l *Listener) classify(dd *delivery, err error, s chainrun.Settlement) (o outcome, counted bool) {
	var cause error
	if dd.fate != nil {
		cause = dd.fate.failedFor
	}
	switch {
	case s == chainrun.Release:
		return succeeded, false
	case cause == nil && err == nil:
		return succeeded, true
	case cause == nil:
		cause = err
	}
	if l.cfg.killSwitch.IgnorePermanent && middleware.IsPermanent(cause) {
		return ignored, true
	}
	return failed, true
}

// tripped reports whether the kill switch has stopped consuming (tripped,
// or probing after a trip): a delivery that fails for good then goes back to
// its queue with a nack, not to the queue's dead-letter exchange.
func (l *Listener) tripped() bool {
	if l.killSwitch == nil {
		return false
	}
	state, _, _ := l.killSwitch.current()
	return state == switchTripped
}

// trippedSignal and probeSucceeded are the kill switch's signals to the
// session, or nil (never ready) without one.
func (s *session) trippedSignal() <-chan struct{} {
	if ks := s.sv.l.killSwitch; ks != nil {
		return ks.tripped
	}
	return nil
}

func (s *session) probeSucceeded() <-chan struct{} {
	if ks := s.sv.l.killSwitch; ks != nil {
		return ks.probeDone
	}
	return nil
}

// trip stops every consumer and ends their deliveries' waits: the messages
// in flight go back to the queue, none to the recoverer because of the trip.
func (s *session) trip() {
	l := s.sv.l
	state, resumeAt, why := l.killSwitch.current()
	if state != switchTripped {
		return // a probe's success overtook the signal
	}
	s.tripped, s.probing, s.careful = true, false, false
	l.tel.KillSwitchTrips.Add(context.Background(), 1, l.attrs.queue.Add...)
	l.tel.KillSwitchState.Record(context.Background(), int64(switchTripped), l.attrs.queue.Record...)
	for _, c := range s.active {
		c.stop()
		c.interruptWaits()
	}
	s.active = s.active[:0]
	l.ready.consuming(false)
	l.cfg.logger.Warn("listener: kill switch tripped: consuming stops, the messages stay on the queue, deliveries in flight go back to it",
		"queue", l.queue, "why", why, "resume_at", resumeAt.Format(time.RFC3339Nano))
}

// probe starts one consumer at prefetch 1.
func (s *session) probe() {
	s.tripped, s.probing = false, true
	s.sv.l.tel.KillSwitchState.Record(context.Background(), int64(switchProbing), s.sv.l.attrs.queue.Record...)
	s.sv.l.cfg.logger.Info("listener: kill switch restart timeout over: probing with one consumer at prefetch 1", "queue", s.sv.l.queue)
}

// resume brings the consumers back after a probe succeeded: the probe
// consumer, at prefetch 1, hands over (it settles what it still gets) and
// fillToMin starts the usual ones.
func (s *session) resume() {
	if !s.probing {
		return
	}
	s.probing = false
	for _, c := range s.active {
		c.handOver.Store(true)
		c.stop()
	}
	s.active = s.active[:0]
	s.sv.l.tel.KillSwitchState.Record(context.Background(), int64(switchClosed), s.sv.l.attrs.queue.Record...)
	s.sv.l.cfg.logger.Info("listener: kill switch probe succeeded: consuming again", "queue", s.sv.l.queue)
}

// resumeTripped tells a new connection's session whether the switch is
// open: a probe cut short by the lost connection starts again at once.
func (k *killSwitch) resumeTripped(now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.state == switchProbing {
		k.state, k.resumeAt = switchTripped, now
	}
	return k.state == switchTripped
}
