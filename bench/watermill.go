package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// consumeWatermill is Watermill's usual reliable consumer: the AMQP
// subscriber under a router with PoisonQueue and Retry.
//
// What maps onto our settings: each router handler Subscribes once, and each
// subscription is one channel with its own basic.qos and basic.consume on
// the subscriber's one connection, so Consumers handlers give that many
// broker consumers and Consume.Qos.PrefetchCount is the prefetch. What does
// not: a subscription hands one message to the router and waits for its
// ack or nack before it takes the next, so each consumer has one message in
// flight whatever the prefetch; the prefetch only keeps the next ones on the
// wire. (watermill-amqp v1.1.4, on streadway/amqp, is the newest the Go
// module proxy serves.)
func consumeWatermill(ctx context.Context, e *env, q string, n int) (s Sample, err error) {
	dlq := q + ".dlq"
	cleanup, err := e.broker.queues(dlq)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()

	cfg := wamqp.NewDurableQueueConfig(e.broker.url)
	cfg.Consume.Qos.PrefetchCount = e.cfg.Prefetch
	logger := watermill.NopLogger{}

	// The poison queue's publisher is set up outside the measurement, as our
	// listener's recoverer publisher is. Unlike ours it does not wait for
	// confirms (it opens a channel per Publish and returns once sent); on the
	// happy path it is never called.
	pub, err := wamqp.NewPublisher(cfg, logger)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, pub.Close()) }()
	poison, err := wmiddleware.PoisonQueue(pub, dlq)
	if err != nil {
		return Sample{}, err
	}
	// Retry's schedule matches ours; MaxRetries counts retries, not
	// attempts, so Retry{MaxRetries: 5} makes up to 6 attempts to our 5.
	retry := wmiddleware.Retry{MaxRetries: 5, InitialInterval: time.Second, Multiplier: 2, MaxInterval: 10 * time.Second}

	t := newTally(n)
	cpu0 := e.cpuMark()
	sub, err := wamqp.NewSubscriber(cfg, logger)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, sub.Close()) }() // idempotent; for when the router never ran
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return Sample{}, err
	}
	// First added is outermost: retries are exhausted before PoisonQueue
	// sees the error.
	router.AddMiddleware(poison, retry.Middleware)
	for i := range e.cfg.Consumers {
		// Both handlers share the subscriber; the router closes it (twice,
		// harmlessly) when it closes.
		router.AddConsumerHandler(fmt.Sprint("consumer-", i), q, sub, func(*message.Message) error {
			t.hit()
			return nil
		})
	}
	ran := make(chan error, 1)
	go func() { ran <- router.Run(ctx) }()
	defer func() {
		err = errors.Join(err, router.Close(), <-ran)
	}()
	select {
	case <-router.Running():
	case err := <-ran:
		ran <- err // for the deferred read
		return Sample{}, fmt.Errorf("watermill router: %w", err)
	}
	if err := t.wait(ctx); err != nil {
		return Sample{}, err
	}
	return sampleOf(t, cpu0), nil
}
