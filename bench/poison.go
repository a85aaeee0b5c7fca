package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// errPoison is what every handler in the poison flood returns.
var errPoison = errors.New("bench: poison message")

// poisonVariants: every message fails for good and must end on the DLQ,
// each copy confirmed by the broker before its original is acked.
func poisonVariants(e *env) []variant {
	c, p := e.cfg.Consumers, e.cfg.Prefetch
	return []variant{
		{name: "raw-republish", run: republishRaw,
			about: fmt.Sprintf("amqp091-go: %d consumers (Qos %d), each with a confirm channel: publish a persistent copy to the DLQ with a deferred confirm, ack the original once it is confirmed", c, p)},
		{name: "raw-annotated", run: republishRawAnnotated,
			about: "as raw-republish, each copy carrying the fault headers the listener's Republish writes for this flood (built once, by recoverer.Republisher.Message): what amqp091-go and the broker pay for the headers alone"},
		{name: "raw-per-copy", run: republishRawPerCopy,
			about: "as raw-annotated, but shaped as a Recoverer must be: each delivery on a goroutine of its own that publishes its copy, waits for that copy's confirm and acks (the listener's shape, without the listener)"},
		{name: "listener", run: republishListener,
			about: "listener, Chain(Retry(5), Recover(Republish(pub, \"\", dlq))), handler returns Permanent(err): no retries, one annotated confirmed copy each"},
	}
}

// republishRaw is the ceiling for moving messages to a DLQ safely: per
// consumer, one confirm channel with publishes pipelined, and a goroutine
// that acks each original in order as its copy's confirm arrives.
func republishRaw(ctx context.Context, e *env, q string, n int) (s Sample, err error) {
	return republishRawWith(ctx, e, q, n, nil, false)
}

// republishRawAnnotated is republishRaw with the listener's fault headers on
// every copy, so that the report can tell the cost of the headers (amqp091's
// encoding, the broker's bigger messages) from the cost of our code.
func republishRawAnnotated(ctx context.Context, e *env, q string, n int) (s Sample, err error) {
	headers, err := faultHeaders(q)
	if err != nil {
		return Sample{}, err
	}
	return republishRawWith(ctx, e, q, n, headers, false)
}

// republishRawPerCopy is raw-annotated in the shape a synchronous Recoverer
// imposes: one goroutine per delivery, waiting for its own confirm, instead
// of one publishing and one acking goroutine per consumer that pipeline.
func republishRawPerCopy(ctx context.Context, e *env, q string, n int) (s Sample, err error) {
	headers, err := faultHeaders(q)
	if err != nil {
		return Sample{}, err
	}
	return republishRawWith(ctx, e, q, n, headers, true)
}

// faultHeaders are the headers Republish(pub, "", q+".dlq") gives a copy of
// a message of the flood that failed with Permanent(errPoison) on queue q.
func faultHeaders(q string) (amqp.Table, error) {
	r := recoverer.Republish(frameOnly{}, "", q+".dlq")
	ctx := chainctx.WithQueue(context.Background(), q)
	msg, err := r.Message(ctx, &amqp.Delivery{RoutingKey: q, Body: []byte("x")}, middleware.Permanent(errPoison))
	return msg.Headers, err
}

// frameOnly is the recoverer.Publisher faultHeaders needs: Message asks only
// for the frame size and the user.
type frameOnly struct{}

func (frameOnly) Publish(context.Context, string, string, amqp.Publishing) error {
	return errors.New("bench: frameOnly publishes nothing")
}
func (frameOnly) FrameMax() int    { return 131072 }
func (frameOnly) Username() string { return "guest" }

func republishRawWith(ctx context.Context, e *env, q string, n int, headers amqp.Table, perCopy bool) (s Sample, err error) {
	dlq := q + ".dlq"
	cleanup, err := e.broker.queues(dlq)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()

	t := newTally(n)
	cpu0 := e.cpuMark()
	conn, err := amqp.Dial(e.broker.url)
	if err != nil {
		return Sample{}, err
	}
	// Closing the connection ends the deliveries, which ends the goroutines.
	var wg sync.WaitGroup
	quit := make(chan struct{})
	defer func() {
		_ = conn.Close()
		close(quit)
		wg.Wait()
	}()
	failed := make(chan error, 2*e.cfg.Consumers) // each goroutine sends at most once
	for i := range e.cfg.Consumers {
		deliveries, pubCh, err := openRepublisher(conn, q, fmt.Sprint("raw-republish-", i), e.cfg.Prefetch)
		if err != nil {
			return Sample{}, err
		}
		if perCopy {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for d := range deliveries {
					t.begin()
					wg.Add(1)
					go func() {
						defer wg.Done()
						dc, err := pubCh.PublishWithDeferredConfirmWithContext(ctx, "", dlq, true, false,
							amqp.Publishing{Headers: headers, Body: d.Body, DeliveryMode: amqp.Persistent})
						if err == nil {
							if ok, werr := dc.WaitContext(ctx); !ok || werr != nil {
								err = fmt.Errorf("copy not confirmed: %v", werr)
							}
						}
						if err != nil {
							select {
							case failed <- err:
							default: // one failure is enough to report
							}
							return
						}
						_ = d.Ack(false)
						t.hit()
					}()
				}
			}()
			continue
		}
		// At most a prefetch of deliveries is unacked, so at most that many
		// copies await their confirm.
		pending := make(chan pendingCopy, e.cfg.Prefetch)
		wg.Add(2)
		go func() {
			defer wg.Done()
			defer close(pending)
			for d := range deliveries {
				t.begin()
				dc, err := pubCh.PublishWithDeferredConfirmWithContext(ctx, "", dlq, true, false,
					amqp.Publishing{Headers: headers, Body: d.Body, DeliveryMode: amqp.Persistent})
				if err != nil {
					failed <- err
					return
				}
				select {
				case pending <- pendingCopy{d, dc}:
				case <-quit:
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for p := range pending {
				if ok, err := p.confirm.WaitContext(ctx); !ok || err != nil {
					failed <- fmt.Errorf("copy not confirmed: %v", err)
					return
				}
				_ = p.original.Ack(false)
				t.hit()
			}
		}()
	}
	waited := make(chan error, 1)
	go func() { waited <- t.wait(ctx) }()
	select {
	case err := <-waited:
		if err != nil {
			return Sample{}, err
		}
	case err := <-failed:
		return Sample{}, err
	}
	s = sampleOf(t, cpu0)
	return s, e.broker.waitDepth(ctx, dlq, n, 10*time.Second)
}

type pendingCopy struct {
	original amqp.Delivery
	confirm  *amqp.DeferredConfirmation
}

// openRepublisher opens a consuming channel and a confirm channel.
func openRepublisher(conn *amqp.Connection, q, tag string, prefetch int) (<-chan amqp.Delivery, *amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return nil, nil, err
	}
	pubCh, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	if err := pubCh.Confirm(false); err != nil {
		return nil, nil, err
	}
	deliveries, err := ch.Consume(q, tag, false, false, false, false, nil)
	return deliveries, pubCh, err
}

// republishListener is the flood through our stack: the recoverer is
// wrapped only to count, after its confirm, the copies safely on the DLQ.
func republishListener(ctx context.Context, e *env, q string, n int) (s Sample, err error) {
	dlq := q + ".dlq"
	pub, done, err := e.withRecovery(dlq)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, done()) }()

	t := newTally(n)
	// Counted as each recovery's outcome comes (OnRecover): a wrapper
	// around the Republisher would hide its asynchronous publish from
	// Recover, and the listener would wait for each confirm.
	counted := middleware.OnRecover(func(_ context.Context, e middleware.RecoverEvent) {
		if e.Err == nil {
			t.hit()
		}
	})
	mw := middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer.Republish(pub, "", dlq), counted))
	handle := func(context.Context, *amqp.Delivery) error {
		t.begin()
		return middleware.Permanent(errPoison)
	}
	cpu0 := e.cpuMark()
	stop, err := startListener(ctx, e, q, mw, handle)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	if err := t.wait(ctx); err != nil {
		return Sample{}, err
	}
	s = sampleOf(t, cpu0)
	return s, e.broker.waitDepth(ctx, dlq, n, 10*time.Second)
}
