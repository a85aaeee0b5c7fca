package listener

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/errtext"
)

// Group runs several listeners on one connection, as RabbitMQ advises (one
// channel per consumer, a connection per process): they start together,
// reconnect together after a loss (one dial, one backoff), shut down
// together, and Run returns the first error that ends any of them. It is
// Spring AMQP's shared connection factory, or Watermill's Router; several
// queues through one handler are several listeners with the same handler
// in one Group.
//
//	orders, _ := listener.New("orders", chain, handleOrder)
//	refunds, _ := listener.New("refunds", chain, handleRefund, listener.WithConcurrentConsumers(2))
//	g, err := listener.NewGroup([]*listener.Listener{orders, refunds}, listener.WithURL(url))
//	err = g.Run(ctx)
//
// Each listener keeps its own chain, consumers, scaling, declarations,
// kill switch, telemetry and Stats; the connection is the group's, so the
// listeners' own connection options (WithURL, WithTLS, WithHeartbeat, ...)
// are not used: give them to NewGroup. Publishing stays on a connection of
// its own (publisher.New), as RabbitMQ advises.
type Group struct {
	listeners []*Listener
	cfg       config
	redacted  string
}

// NewGroup checks the listeners and the group's connection options
// (WithURL or WithURLs, WithTLS, WithHeartbeat, WithConnectionName,
// WithLogger, WithFailFast; other options are refused) and returns the
// Group; it does not connect (Run does). A listener may be in one Group and
// must not be run on its own as well.
func NewGroup(listeners []*Listener, opts ...Option) (*Group, error) {
	cfg := defaultConfig()
	cfg.conn.Name = "amqpretry listener group"
	base := cfg
	for _, opt := range opts {
		opt(&cfg)
	}
	if len(listeners) == 0 {
		cfg.fail("NewGroup expects at least one listener")
	}
	seen := map[*Listener]bool{}
	for i, l := range listeners {
		switch {
		case l == nil:
			cfg.fail("NewGroup expects non-nil listeners, got nil at index %d", i)
		case seen[l]:
			cfg.fail("NewGroup got the listener of queue %q twice", l.queue)
		}
		seen[l] = true
	}
	cfg.checkConnection()
	if unused := cfg.onlyConnectionOptions(base); unused != "" {
		cfg.fail("NewGroup takes connection options only; %s belongs to each listener's New", unused)
	}
	if len(cfg.errs) > 0 {
		return nil, errors.Join(cfg.errs...)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	return &Group{listeners: append([]*Listener(nil), listeners...), cfg: cfg, redacted: cfg.conn.Redacted()}, nil
}

// Run connects, runs every listener on the connection and redials after a
// loss, until ctx is done; then each listener shuts down as its Run would
// (within its own WithShutdownTimeout, all at once) and Run returns nil.
// What ends one listener's Run (a refused login or declaration, a consume
// the broker refuses, a missing queue with WithMissingQueueFatal) shuts
// the others down too, and Run returns that error. A declaration that fails
// for what may heal (a 404: an exchange not declared yet) is retried on the
// connection with the listener's own backoff while the others consume. Every goroutine it
// started has ended when it returns.
func (g *Group) Run(ctx context.Context) error {
	for i, l := range g.listeners {
		if !l.running.CompareAndSwap(false, true) {
			for _, started := range g.listeners[:i] {
				started.running.Store(false)
			}
			return fmt.Errorf("%w: the listener of queue %q", ErrAlreadyRunning, l.queue)
		}
	}
	runCtx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	svs := make([]*supervisor, len(g.listeners))
	for i, l := range g.listeners {
		svs[i] = newSupervisor(l, runCtx)
		defer svs[i].cancelHandlers()
	}
	if !g.cfg.urlSet {
		g.cfg.logger.Warn("listener group: no WithURL or WithURLs: consuming from the default broker", "url", g.redacted)
	}
	err := connectionLoop{
		cfg: &g.cfg, who: "listener group", attrs: []any{"listeners", len(svs)},
		serve: func(conn *amqpconn.Conn) (bool, error) { return g.serve(runCtx, stopAll, conn, svs) },
		lost: func(err error) {
			for _, sv := range svs {
				sv.l.ready.lost(err)
			}
		},
		guarding: func() {
			for _, sv := range svs {
				sv.l.guarded.Store(true)
			}
		},
	}.run(ctx, runCtx)
	var wg sync.WaitGroup
	for _, sv := range svs {
		wg.Add(1)
		go func() { defer wg.Done(); sv.shutdown() }()
	}
	wg.Wait()
	for _, sv := range svs {
		sv.closers.Wait()
	}
	var fatal *fatalError
	if errors.As(err, &fatal) {
		err = fatal.err
	}
	for _, l := range g.listeners {
		l.ready.stop(err)
	}
	return err
}

// WaitReady blocks until every listener of the group is ready (see
// Listener.WaitReady), ctx ends, or Run returns.
func (g *Group) WaitReady(ctx context.Context) error {
	for _, l := range g.listeners {
		if err := l.WaitReady(ctx); err != nil {
			return fmt.Errorf("listener group: queue %q: %w", l.queue, err)
		}
	}
	return nil
}

// Listeners returns the group's listeners, in the order given.
func (g *Group) Listeners() []*Listener { return append([]*Listener(nil), g.listeners...) }

// serve runs every listener on conn until all have returned: a lost
// connection ends them all; a fatal error of one stops the others
// (stopAll), which shut down gracefully, and is returned. consumed: some
// listener got as far as consuming.
func (g *Group) serve(ctx context.Context, stopAll context.CancelFunc, conn *amqpconn.Conn, svs []*supervisor) (consumed bool, err error) {
	defer conn.Abandon()
	defer svs[0].closeBounded(conn.Close)
	// At shutdown, a listener stuck opening its consumers on a frozen
	// connection has the connection abandoned under it, as a lone
	// listener's is, but only once every other listener has returned: the
	// connection is theirs too, and a listener still draining needs it for
	// its acks.
	returned := make([]atomic.Bool, len(svs))
	stop := abandonStuckSetup(ctx, conn, &svs[0].closers, func() bool {
		stuck := false
		for i, sv := range svs {
			if returned[i].Load() {
				continue
			}
			if !sv.settingUp.Load() {
				return false
			}
			stuck = true
		}
		return stuck
	})
	defer stop()
	errs := make(chan error, len(svs))
	for i, sv := range svs {
		sv.consumed = false
		sv.l.ready.connected()
		go func() {
			err := sv.serveInGroup(ctx, conn)
			returned[i].Store(true)
			errs <- err
		}()
	}
	for range svs {
		e := <-errs
		switch {
		case isFatal(e) && !isFatal(err):
			err = e
			stopAll() // the others shut down; Run returns this
		case e != nil && err == nil:
			err = e
		}
	}
	for _, sv := range svs {
		consumed = consumed || sv.consumed
	}
	return consumed, err
}

// serveInGroup is serveOn on the group's connection, served again, after a
// backoff of the listener's own, when it ends for something a retry may
// heal while the connection lives: a declaration that found no exchange yet
// (404), a channel the broker closed. A lone listener redials for it; in a
// group the others go on consuming meanwhile. It returns nil when ctx is
// done, and a fatal error or the connection's loss as serveOn does.
func (sv *supervisor) serveInGroup(ctx context.Context, conn *amqpconn.Conn) error {
	l := sv.l
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	retry := amqpconn.NewRedialer()
	for {
		consumedBefore := sv.consumed
		sv.consumed = false
		err := sv.serveOn(ctx, conn)
		if sv.consumed {
			retry.Reset() // it got as far as consuming: the next problem starts the backoff over
		}
		sv.consumed = sv.consumed || consumedBefore
		if err == nil || isFatal(err) || conn.IsClosed() || ctx.Err() != nil {
			return err
		}
		delay := retry.Next()
		l.ready.set(func(r *readiness) { r.lastErr = err })
		l.cfg.logger.Warn("listener: declaration failed; retrying on the group's connection", "queue", l.queue, "error", errtext.String(err), "retry_in", delay)
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-closed: // the connection's loss: serveOn would see it at once
			timer.Stop()
			return errors.New("connection closed")
		case <-timer.C:
		}
	}
}

// onlyConnectionOptions names an option given to NewGroup that is not a
// connection option, "" if none: it would be silently unused.
func (c config) onlyConnectionOptions(base config) string {
	switch {
	case c.min != base.min, c.maxSet:
		return "WithConcurrentConsumers or WithMaxConcurrentConsumers"
	case c.prefetchSet:
		return "WithPrefetch"
	case c.declare != nil:
		return "WithDeclare"
	case c.shutdownTimeout != base.shutdownTimeout:
		return "WithShutdownTimeout"
	case c.consumerTimeout != base.consumerTimeout, c.consumerTimeoutArg != 0:
		return "WithConsumerTimeout or WithConsumerTimeoutArgument"
	case c.requeueDelay != base.requeueDelay, c.requeueDelayMax != base.requeueDelayMax:
		return "WithRequeueDelay"
	case c.redeliveryLimit != 0:
		return "WithRedeliveryLimit"
	case c.killSwitch != nil:
		return "WithKillSwitch"
	case c.consumer != base.consumer:
		return "WithConsumerPriority, WithExclusive or WithConsumerTagPrefix"
	case c.missingFatal:
		return "WithMissingQueueFatal"
	case c.scaleInterval != base.scaleInterval, c.idleTimeout != base.idleTimeout:
		return "WithScaleInterval or WithIdleTimeout"
	case c.telemetry.TracerProvider != nil, c.telemetry.MeterProvider != nil, c.telemetry.Propagators != nil, c.producerParent:
		return "a telemetry option"
	}
	return ""
}
