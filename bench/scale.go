package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The scale-up test: a slow handler behind a backlog, from 1 consumer to 8.
const (
	scaleFrom    = 1
	scaleTo      = 8
	scaleHandler = 20 * time.Millisecond
	scalePoll    = 20 * time.Millisecond
	scaleMaxWait = 60 * time.Second
)

// ScaleUp is how long the listener took to grow to its maximum, as the
// broker saw it, and the steps it took on the way.
type ScaleUp struct {
	Backlog            int         `json:"backlog"`
	HandlerMS          float64     `json:"handler_ms"`
	From               int         `json:"from_consumers"`
	To                 int         `json:"to_consumers"`
	SecondsFromFirst   float64     `json:"seconds_from_first_delivery"`
	SecondsFromRun     float64     `json:"seconds_from_run"`
	ConsumerTimeline   []ScaleStep `json:"consumer_timeline"`
	HandledBeforeScale int         `json:"handled_before_max"`
}

// ScaleStep is a change in the broker's consumer count, timed from Run.
type ScaleStep struct {
	Seconds   float64 `json:"seconds_from_run"`
	Consumers int     `json:"consumers"`
}

// measureScaleUp fills a backlog, starts a listener at 1 consumer that may
// grow to 8, and polls the broker's consumer count (a passive declare) until
// it reads 8. Shrinking back is not measured: it waits out the idle timeout.
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

	t := newTally(e.cfg.ScaleBacklog)
	handle := func(ctx context.Context, _ *amqp.Delivery) error {
		t.hit()
		select { // a 20ms job that stops at shutdown
		case <-time.After(scaleHandler):
		case <-ctx.Done():
		}
		return nil
	}
	mw := middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer.Republish(pub, "", dlq)))
	started := time.Now()
	stop, err := startListener(ctx, e, q, mw, handle,
		listener.WithConcurrentConsumers(scaleFrom), listener.WithMaxConcurrentConsumers(scaleTo))
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()

	res = &ScaleUp{Backlog: e.cfg.ScaleBacklog, HandlerMS: ms(scaleHandler), From: scaleFrom, To: scaleTo}
	ch, err := e.broker.conn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	last := -1
	for {
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			return nil, fmt.Errorf("inspect %s: %w", q, err)
		}
		at := time.Now()
		now := at.Sub(started)
		if info.Consumers != last {
			last = info.Consumers
			res.ConsumerTimeline = append(res.ConsumerTimeline, ScaleStep{Seconds: now.Seconds(), Consumers: last})
		}
		if last >= scaleTo {
			res.SecondsFromRun = now.Seconds()
			if first := t.first.Load(); first != 0 {
				res.SecondsFromFirst = (at.Sub(epoch) - time.Duration(first)).Seconds()
			}
			res.HandledBeforeScale = t.count()
			return res, nil
		}
		if now > scaleMaxWait {
			return nil, fmt.Errorf("the broker never reported %d consumers within %v (last: %d, handled: %d)", scaleTo, scaleMaxWait, last, t.count())
		}
		if err := sleep(ctx, scalePoll); err != nil {
			return nil, err
		}
	}
}
