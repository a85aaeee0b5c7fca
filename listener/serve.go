package listener

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
)

// serve consumes on one connection until ctx is done (it then shuts down and
// returns nil), the connection is lost (it returns the loss), or something
// fatal happens. It closes the connection when it returns.
func (sv *supervisor) serve(ctx context.Context, conn *amqpconn.Conn) error {
	if ctx.Err() != nil {
		conn.Abandon()
		return nil
	}
	// After a graceful shutdown everything is settled and Close is clean;
	// after a loss, a write stuck in the socket would hang amqp091's
	// shutdown, so the socket goes first.
	defer conn.Abandon()
	defer sv.closeBounded(conn.Close)
	return sv.serveOn(ctx, conn)
}

// serveOn is serve on a connection it does not own (a Group's): it leaves
// the connection open, and when it returns for something fatal it stops
// its consumers first, since the connection lives on for the others.
func (sv *supervisor) serveOn(ctx context.Context, conn *amqpconn.Conn) (err error) {
	l := sv.l
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))

	if err := sv.declare(conn.Connection); err != nil {
		return err
	}
	s := &session{sv: sv, conn: conn.Connection, ended: make(chan *consumer, l.channelCap()), calm: make(chan struct{}, 1)}
	defer func() {
		if err != nil && !conn.IsClosed() {
			for _, c := range s.active {
				c.stop()
			}
			if isFatal(err) {
				sv.interruptAll()
				return
			}
			// Served again (a Group's retry, a lone listener's redial): only
			// this session's consumers hand their waiting deliveries back;
			// the next session's must not start interrupted.
			for _, c := range s.active {
				c.interruptWaits()
			}
		}
	}()
	if l.killSwitch != nil && l.killSwitch.resumeTripped(time.Now()) {
		s.tripped = true // the probe comes on the next tick that finds it due
	} else if l.cfg.redeliveryLimit > 0 {
		s.beCareful()
	}
	s.restart = backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(500*time.Millisecond),
		backoff.WithMaxInterval(30*time.Second),
		backoff.WithMaxElapsedTime(0),
	)
	if err := s.fillToMin(); err != nil {
		return err
	}
	ticker := time.NewTicker(l.cfg.scaleInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			sv.draining()
			// Stop every consumer before interrupting: deliveries requeued by
			// the interrupt must not come back to consumers of ours.
			for _, c := range s.active {
				c.stop()
			}
			sv.interruptAll()
			sv.shutdown() // the connection stays open until in-flight deliveries are settled
			return nil
		case err := <-connClosed:
			if sv.consumed {
				sv.lostAt = time.Now() // an exclusive consumer of it may linger (WithExclusive)
			}
			conn.Abandon()
			if err == nil {
				return errors.New("connection closed")
			}
			return err
		case c := <-s.ended:
			s.active = slices.DeleteFunc(s.active, func(a *consumer) bool { return a == c })
			if err := s.fillToMin(); err != nil {
				return err
			}
		case <-s.calm:
			if s.calmEnough() {
				s.endCare("a message that was never delivered before arrived")
				if err := s.fillToMin(); err != nil {
					return err
				}
			}
		case <-s.trippedSignal():
			s.trip()
		case <-s.probeSucceeded():
			s.resume()
			if err := s.fillToMin(); err != nil {
				return err
			}
		case <-ticker.C:
			if s.tripped && l.killSwitch.probeDue(time.Now()) {
				s.probe()
			}
			if s.careful && s.carefulIdle() {
				s.endCare("no returned message for a second")
			}
			if err := s.fillToMin(); err != nil {
				return err
			}
			if !s.careful && !s.tripped && !s.probing {
				s.scale()
			}
			l.watchAges()
			l.logDeadLetterSummary(l.deadLetters.due(time.Now(), false))
		}
	}
}

// declare runs the user's declarations on a channel of their own.
func (sv *supervisor) declare(conn *amqp.Connection) error {
	if sv.l.cfg.declare == nil {
		return nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	// A dlx.Topology asks which broker it declares on.
	defer amqpconn.Remember(ch, amqpconn.VersionOf(conn.Properties))()
	if err := sv.l.cfg.declare(ch); err != nil {
		if declarationRefused(err, conn) {
			return &fatalError{fmt.Errorf("listener: declaring for queue %q: %w", sv.l.queue, err)}
		}
		return fmt.Errorf("listener: declaring for queue %q: %w", sv.l.queue, err)
	}
	if amqpconn.DeclaredSingleActive(ch, sv.l.queue) {
		sv.l.declaredSingleActive()
	}
	return nil
}

// declarationRefused tells a declaration that no retry can make succeed
// (the broker's 403, 405, 406 or 530, or an error of the declaring code's
// own, such as an invalid dlx.Topology or one the broker's version cannot
// hold) from an outage: a lost connection or channel, or a 404 (a binding to
// an exchange that another service may declare yet), which are retried.
func declarationRefused(err error, conn *amqp.Connection) bool {
	if conn.IsClosed() || errors.Is(err, amqp.ErrClosed) {
		return false
	}
	var aerr *amqp.Error
	if errors.As(err, &aerr) {
		switch aerr.Code {
		case amqp.PreconditionFailed, amqp.AccessRefused, amqp.ResourceLocked, amqp.NotAllowed:
			return true
		}
		return false
	}
	return true
}

// session is serve's state for one connection.
type session struct {
	sv      *supervisor
	conn    *amqp.Connection
	ended   chan *consumer
	active  []*consumer // oldest first
	control *amqp.Channel

	// careful: one consumer at prefetch 1 until the returned messages are
	// through (WithRedeliveryLimit; redelivery.go). A fresh message on calm,
	// or a second with nothing to do, ends it.
	careful      bool
	carefulSince time.Time // when the careful consumer started
	calm         chan struct{}

	// tripped: the kill switch stopped consuming; probing: one consumer at
	// prefetch 1 tries again (killswitch.go).
	tripped, probing bool

	starvedLooks int // scaling looks in a row that found a consumer starved (singleactive.go)

	restart    *backoff.ExponentialBackOff
	restartAt  time.Time
	redeclared bool // declared again since the last consumer started

	lastSample time.Time
	lastDepth  time.Time
	// the depth read at lastDepth, which a look that asks again gets
	depthRead int
	depthOK   bool
}

// baseChannels is how many channels the session keeps at least: none while
// the kill switch has tripped; one for a careful start, a probe, or when the
// queue's order must hold; else the concurrent count, and at least two when
// the listener may scale: two channels that get messages at once tell it
// the queue is not single active consumer, which it must know before it runs
// handlers side by side (singleactive.go).
func (s *session) baseChannels() int {
	l := s.sv.l
	switch {
	case s.tripped:
		return 0
	case s.careful, s.probing, l.keepsOrder():
		return 1
	case l.cfg.max > 1:
		return max(l.cfg.min, 2)
	}
	return l.cfg.min
}

// channelCap is the most channels a listener opens: its maximum handlers
// with WithPrefetch (as many channels as handlers, each at that prefetch,
// can hold no fewer deliveries than before); with the default prefetch,
// enough for DefaultPrefetch deliveries per handler slot waiting between
// retries.
func (l *Listener) channelCap() int {
	base := max(l.cfg.min, 2)
	if l.cfg.prefetchSet {
		return max(base, l.cfg.max)
	}
	return min(max(base, (DefaultPrefetch*l.cfg.max+l.cfg.prefetch-1)/l.cfg.prefetch), MaxConsumers)
}

// updateCeiling sets how many handlers may run at once now: one during a
// careful start or a probe, while the queue's order must hold, or until two
// channels have had messages at once (seeParallel: before that the queue
// may be single active consumer, whose order handlers side by side would
// break); the maximum otherwise.
func (s *session) updateCeiling() {
	l := s.sv.l
	ceiling := l.cfg.max
	if s.careful || s.probing || l.keepsOrder() || !l.parallel.Load() {
		ceiling = 1
	}
	l.pool.setCeiling(ceiling)
}

// fillToMin starts channels until the base count is reached, backing
// off while the queue is missing or the broker refuses, and sets the pool's
// ceiling.
func (s *session) fillToMin() error {
	l := s.sv.l
	want := s.baseChannels()
	if s.tripped {
		return nil
	}
	defer func() {
		s.updateCeiling()
		l.ready.consuming(len(s.active) >= max(want, 1))
	}()
	for len(s.active) < want && !time.Now().Before(s.restartAt) && s.sv.ctx.Err() == nil {
		if err := s.add(); err != nil {
			if s.conn.IsClosed() {
				return nil // the connection loss arrives next
			}
			var aerr *amqp.Error
			missing := errors.As(err, &aerr) && aerr.Code == amqp.NotFound
			ours, why := s.exclusiveMayBeOurs(aerr, time.Now())
			if refused := l.consumeRefused(aerr); refused != nil && !ours {
				return &fatalError{refused}
			}
			if missing && l.cfg.missingFatal {
				return &fatalError{fmt.Errorf("%w: %q (%v)", ErrQueueNotFound, l.queue, err)}
			}
			if missing && l.cfg.declare != nil && !s.redeclared {
				// Deleted while we ran: declare it again, once per outage.
				s.redeclared = true
				l.cfg.logger.Warn("listener: the queue disappeared; declaring it again", "queue", l.queue)
				if err := s.sv.declare(s.conn); err != nil {
					return err
				}
				continue
			}
			l.ready.set(func(r *readiness) { r.lastErr = err })
			delay := s.restart.NextBackOff()
			s.restartAt = time.Now().Add(delay)
			if missing {
				l.cfg.logger.Warn("listener: the queue does not exist; retrying (declare it, or pass WithDeclare)", "queue", l.queue, "retry_in", delay)
			} else if ours {
				l.cfg.logger.Info("listener: the queue is held by an exclusive consumer, perhaps this listener's own; retrying",
					"queue", l.queue, "why", why, "retry_in", delay)
			} else {
				l.cfg.logger.Warn("listener: cannot start a consumer; retrying", "queue", l.queue, "error", err, "retry_in", delay)
			}
			return nil
		}
		s.restart.Reset()
		s.redeclared = false
		s.sv.consumed = true
	}
	return nil
}

// consumeRefused is the error that ends Run when the broker refused
// basic.consume (or its qos) for good, or nil for what a retry may heal.
func (l *Listener) consumeRefused(aerr *amqp.Error) error {
	if aerr == nil {
		return nil
	}
	switch aerr.Code {
	case amqp.PreconditionFailed, amqp.AccessRefused, amqp.ResourceLocked:
	default:
		return nil
	}
	e := &ConsumeRefusedError{Queue: l.queue, Err: aerr}
	switch {
	case l.cfg.consumerTimeoutArg > 0 && strings.Contains(aerr.Reason, "x-consumer-timeout"):
		e.Fix = fmt.Sprintf("WithConsumerTimeoutArgument(%v) sends x-consumer-timeout, which this queue's type does not take "+
			"(RabbitMQ 4.3 applies consumer timeouts to quorum queues only, and refuses the argument on classic queues): "+
			"drop the option, or consume from a quorum queue", l.cfg.consumerTimeoutArg)
	case aerr.Code == amqp.AccessRefused && strings.Contains(aerr.Reason, "exclusive") && l.cfg.consumer.exclusive:
		e.Fix = "WithExclusive asks to be the queue's only consumer, and the queue has another one, exclusive or not " +
			"(rabbitmqctl list_consumers shows it, with its tag and channel): stop it, or drop WithExclusive"
	case aerr.Code == amqp.AccessRefused && strings.Contains(aerr.Reason, "exclusive"):
		e.Fix = "another consumer holds the queue exclusively (an exclusive basic.consume: a listener with WithExclusive, " +
			"a Spring container with exclusive set, MassTransit's ExclusiveConsumer; rabbitmqctl list_consumers shows it, with its tag and channel), " +
			"and while it consumes the broker refuses every other consumer: stop it, or consume another queue. " +
			"For consumers that stand by and take over from each other, use a single-active-consumer queue instead (dlx.Topology.SingleActiveConsumer)"
	case aerr.Code == amqp.AccessRefused:
		e.Fix = "the user may not read from the queue: grant it read permission (rabbitmqctl set_permissions)"
	case aerr.Code == amqp.ResourceLocked:
		e.Fix = "the queue is exclusive to another connection"
	}
	return e
}

func (s *session) add() error {
	var calm chan<- struct{}
	prefetch := 0
	if s.careful {
		calm, prefetch = s.calm, 1
	}
	if s.probing {
		prefetch = 1
	}
	c, err := s.sv.startConsumer(s.conn, s.ended, calm, prefetch)
	if err != nil {
		return err
	}
	if s.careful {
		s.carefulSince = time.Now()
	}
	s.active = append(s.active, c)
	return nil
}

// scale looks at the pool and the channels at every scaling tick: it
// watches for a single-active queue, grows or shrinks the pool of handler
// slots, and opens or closes channels.
func (s *session) scale() {
	l := s.sv.l
	now := time.Now()
	mono := monotime()
	first := s.lastSample.IsZero()
	s.lastSample = now
	var calls uint64
	for _, c := range s.active {
		n := c.calls.Load()
		calls += n - c.sampledCalls
		c.sampledCalls = n
	}
	peak, fullAt := l.pool.look()
	if len(s.active) == 0 {
		return
	}
	// On a single-active-consumer queue more channels add nothing, and
	// handlers side by side would break its order: the listener runs one
	// handler until two of its channels have had messages at once
	// (seeParallel), and once it is plain that the queue is single-active
	// it stops adding channels (singleactive.go).
	s.seeParallel()
	s.updateCeiling()
	if first {
		return // the calls counted so far are since the start, not the last look
	}
	s.watchSingleActive(now, mono, calls > 0 || l.pool.busy.Load() > 0)
	s.scalePool(now, mono, peak, fullAt)
	s.scaleChannels(now, mono)
}

// scalePool grows the pool by a slot when every slot is taken and messages
// wait at the broker (a delivery that waits for a slot in the process grows
// it at once: workers.enter), and shrinks it to the most calls that ran at
// once in the last look when none has found it full for the idle timeout.
func (s *session) scalePool(now time.Time, mono int64, peak int32, fullAt int64) {
	l := s.sv.l
	w := l.pool
	limit := w.limit.Load()
	if limit < w.ceiling.Load() && w.busy.Load() >= limit {
		if depth, ok := s.depth(now); ok && depth > 0 && w.grow() {
			l.cfg.logger.Debug("listener: more handlers at once", "queue", l.queue, "handlers", limit+1, "ready", depth)
		}
		return
	}
	if limit > w.floor && time.Duration(mono-fullAt) >= l.cfg.idleTimeout {
		w.shrinkTo(peak)
		if after := w.limit.Load(); after < limit {
			l.cfg.logger.Debug("listener: fewer handlers at once", "queue", l.queue, "handlers", after, "idle", time.Duration(mono-fullAt).Round(time.Millisecond))
		}
	}
}

// scaleChannels opens channels when every one is full of deliveries that
// do not wait for a handler slot (they wait between retries, or run while
// the pool has room) and messages wait at the broker, enough for the
// backlog at the prefetch; and closes channels above the base, newest first,
// that have had nothing in flight for the idle timeout.
func (s *session) scaleChannels(now time.Time, mono int64) {
	l := s.sv.l
	n := len(s.active)
	full := n > 0 && l.pool.busy.Load() < l.pool.ceiling.Load()
	for _, c := range s.active {
		if !full {
			break
		}
		full = !c.stopping.Load() && c.inFlight.Load() >= int64(c.prefetch) && c.waiting.Load() == 0
	}
	capacity := l.channelCap()
	if l.keepsOrder() {
		capacity = 1
	}
	if full && n < capacity && s.starvedLooks == 0 && (n == 1 || l.parallel.Load()) {
		depth, ok := s.depth(now)
		if ok && depth > 0 {
			add := max((depth+l.cfg.prefetch-1)/l.cfg.prefetch, 1)
			if !l.parallel.Load() {
				add = 1 // and no more until it has had messages (seeParallel)
			}
			add = min(add, capacity-n)
			started := 0
			for range add {
				if err := s.add(); err != nil {
					l.cfg.logger.Warn("listener: cannot open another channel", "queue", l.queue, "error", err)
					break
				}
				started++
			}
			l.cfg.logger.Debug("listener: channels full of deliveries waiting between retries: opened more", "queue", l.queue,
				"channels", len(s.active), "added", started, "ready", depth)
		}
		return
	}
	base := s.baseChannels()
	for i := len(s.active) - 1; i >= 0 && len(s.active) > base; i-- {
		c := s.active[i]
		idle := time.Duration(mono - c.lastActive.Load())
		if c.inFlight.Load() == 0 && idle >= l.cfg.idleTimeout && !s.spareForVerdict(c, idle) {
			c.stop()
			s.active = slices.Delete(s.active, i, i+1)
			l.cfg.logger.Debug("listener: closed an idle channel", "queue", l.queue, "channels", len(s.active), "idle", idle)
		}
	}
}

// depth is the number of ready messages, from a passive declare on a control
// channel, at most every 200ms; the parts of one look (same now) that ask
// share one read.
func (s *session) depth(now time.Time) (int, bool) {
	if now.Equal(s.lastDepth) {
		return s.depthRead, s.depthOK
	}
	if now.Sub(s.lastDepth) < 200*time.Millisecond {
		return 0, false
	}
	s.lastDepth = now
	s.depthRead, s.depthOK = s.readDepth()
	return s.depthRead, s.depthOK
}

func (s *session) readDepth() (int, bool) {
	if s.control == nil || s.control.IsClosed() {
		ch, err := s.conn.Channel()
		if err != nil {
			return 0, false
		}
		s.control = ch
	}
	q, err := s.control.QueueDeclarePassive(s.sv.l.queue, true, false, false, false, nil)
	if err != nil {
		return 0, false
	}
	return q.Messages, true
}
