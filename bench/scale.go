package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The scale-up test: a slow handler behind a backlog, from 1 handler at a
// time to 8.
const (
	scaleFrom    = 1
	scaleTo      = 8
	scaleHandler = 20 * time.Millisecond
	scaleMaxWait = 60 * time.Second
	// scaleGoal is how soon after Run the listener should run scaleTo
	// handlers at once: a backlog of slow messages must not wait for
	// the pool to grow one step at a time.
	scaleGoal = 500 * time.Millisecond
)

// ScaleUp is how long the listener took to run its maximum of handlers at
// once, as the handlers themselves counted, and the steps on the way.
//
// From and To keep their JSON names from when they were the broker's
// consumers (one channel each); since the listener's channels share a pool
// of handler slots they are handlers at a time, and the broker sees fewer
// consumers (BrokerConsumers).
type ScaleUp struct {
	Backlog          int     `json:"backlog"`
	HandlerMS        float64 `json:"handler_ms"`
	From             int     `json:"from_consumers"`
	To               int     `json:"to_consumers"`
	SecondsFromFirst float64 `json:"seconds_from_first_delivery"`
	SecondsFromRun   float64 `json:"seconds_from_run"`
	// HandlerTimeline is each rise of the most handlers that ran at once.
	HandlerTimeline []ScaleStep `json:"handler_timeline"`
	// HandledBeforeScale is how many handlers had returned when To first
	// ran at once.
	HandledBeforeScale int `json:"handled_before_max"`
	// BrokerConsumers is the queue's consumer count just after: the
	// listener's channels, not its handlers.
	BrokerConsumers int       `json:"broker_consumers_at_max"`
	Goal            LimitGoal `json:"goal"`
}

// ScaleStep is the moment the most handlers running at once rose to
// Handlers, timed from Run.
type ScaleStep struct {
	Seconds  float64 `json:"seconds_from_run"`
	Handlers int     `json:"handlers"`
}

// measureScaleUp fills a backlog, starts a listener at 1 handler at a time
// that may grow to 8, and waits until 8 handlers run at once, counted in
// the handler: the broker's consumer count shows the listener's channels,
// which no longer grow with the handlers. Shrinking back is not measured:
// it waits out the idle timeout.
func measureScaleUp(ctx context.Context, e *env) (res *ScaleUp, err error) {
	q := uniqueName("scale")
	dlq := q + ".dlq"
	pub, done, err := e.withRecovery(q, dlq)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, done()) }()
	if err := e.broker.fill(ctx, q, e.cfg.ScaleBacklog); err != nil {
		return nil, err
	}

	t, g := newTally(e.cfg.ScaleBacklog), newGauge(scaleTo)
	full := make(chan struct{})
	var handledAtFull atomic.Int64
	handle := func(ctx context.Context, _ *amqp.Delivery) error {
		t.begin()
		if g.enter() {
			handledAtFull.Store(int64(t.count()))
			close(full)
		}
		work(ctx, scaleHandler)
		g.leave()
		t.hit()
		return nil
	}
	mw := middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer.Republish(pub, "", dlq)))
	started := time.Since(epoch)
	stop, err := startListener(ctx, e, q, mw, handle,
		listener.WithConcurrentConsumers(scaleFrom), listener.WithMaxConcurrentConsumers(scaleTo))
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()

	timeout := time.NewTimer(scaleMaxWait)
	defer timeout.Stop()
	select {
	case <-full:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timeout.C:
		return nil, fmt.Errorf("%d handlers never ran at once within %v (at most %d did; %d handled)", scaleTo, scaleMaxWait, g.highest(), t.count())
	}
	at, _ := g.reachedAt()
	res = &ScaleUp{
		Backlog: e.cfg.ScaleBacklog, HandlerMS: ms(scaleHandler), From: scaleFrom, To: scaleTo,
		SecondsFromRun:     (at - started).Seconds(),
		SecondsFromFirst:   (at - time.Duration(t.first.Load())).Seconds(),
		HandledBeforeScale: int(handledAtFull.Load()),
	}
	for _, st := range g.timeline() {
		res.HandlerTimeline = append(res.HandlerTimeline, ScaleStep{Seconds: (st.At - started).Seconds(), Handlers: st.Handlers})
	}
	info, err := e.broker.inspect(q)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", q, err)
	}
	res.BrokerConsumers = info.Consumers
	res.Goal = newLimitGoal(fmt.Sprintf("%d → %d handlers at a time, from Run", scaleFrom, scaleTo), true, scaleGoal.Seconds(), "s", res.SecondsFromRun)
	return res, nil
}

// work is a slow job: it waits d, or less if ctx ends first (the listener
// is stopping), as a handler that respects its context does.
func work(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
