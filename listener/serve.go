package listener

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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
	stop := sv.boundSetupAtShutdown(ctx, conn)
	defer stop()
	return sv.serveOn(ctx, conn)
}

// boundSetupAtShutdown watches, once ctx is done, for serve stuck in its
// declarations (WithDeclare) or opening a consumer: a channel, its qos and
// its basic.consume each wait for the broker's reply, which a frozen
// connection never sends (amqp091 would wait until the heartbeat gives up,
// 15 s and more), and serve sees the shutdown only once the call returns. A setup still waiting closeWait after the
// shutdown began, or begun after it, has the socket abandoned under it: the
// call fails at once, and the shutdown goes on. (A delivery in flight then
// cannot be settled; on a frozen connection it could not be anyway, and the
// broker requeues it.) stop ends the watch.
func (sv *supervisor) boundSetupAtShutdown(ctx context.Context, conn *amqpconn.Conn) (stop func()) {
	return abandonStuckSetup(ctx, conn, &sv.closers, sv.settingUp.Load)
}

// abandonStuckSetup abandons conn when, once ctx is done, stuck says so at
// a tick of closeWait: the watch of boundSetupAtShutdown, for a connection
// of one listener or of a Group. closers waits for the watch.
func abandonStuckSetup(ctx context.Context, conn *amqpconn.Conn, closers *sync.WaitGroup, stuck func() bool) (stop func()) {
	done := make(chan struct{})
	closers.Add(1)
	go func() {
		defer closers.Done()
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		tick := time.NewTicker(closeWait)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				if stuck() {
					conn.Abandon()
					return
				}
			case <-done:
				return
			}
		}
	}()
	return func() { close(done) }
}

// serveOn is serve on a connection it does not own (a Group's): it leaves
// the connection open, and when it returns for something fatal it stops
// its consumers first, since the connection lives on for the others.
func (sv *supervisor) serveOn(ctx context.Context, conn *amqpconn.Conn) (err error) {
	l := sv.l
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))

	sv.settingUp.Store(true)
	err = sv.declare(conn.Connection)
	sv.settingUp.Store(false)
	if err != nil {
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
			l.logSummariesDue(false)
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
	s.sv.settingUp.Store(true)
	c, err := s.sv.startConsumer(s.conn, s.ended, calm, prefetch)
	s.sv.settingUp.Store(false)
	if err != nil {
		return err
	}
	if s.careful {
		s.carefulSince = time.Now()
	}
	s.active = append(s.active, c)
	return nil
}
