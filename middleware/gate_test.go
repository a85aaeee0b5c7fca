package middleware_test

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// gate admits one handler at a time, as one listener consumer does.
func gate(slot chan struct{}, h middleware.Handler) middleware.Handler {
	return func(ctx context.Context, d *amqp.Delivery) error {
		select {
		case slot <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-slot }()
		return h(ctx, d)
	}
}

// Spring's blocking-retry case: one worker, msg1 is poison and retries, msg2 is
// healthy. With the gate around the handler only, msg2 is handled while msg1
// waits in backoff instead of after msg1's whole retry cycle.
func TestGateIsFreeWhileRetryWaits(t *testing.T) {
	var mu sync.Mutex
	var events []string
	record := func(e string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}
	handle := func(_ context.Context, d *amqp.Delivery) error {
		record(d.MessageId + " handled")
		if d.MessageId == "msg1" {
			return errBoom
		}
		return nil
	}
	slot := make(chan struct{}, 1)
	chain := middleware.Chain(
		middleware.Retry(3, middleware.WithInitialInterval(300*time.Millisecond)),
		middleware.Recover(middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })),
	)
	h := chain(gate(slot, handle))

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = h(context.Background(), &amqp.Delivery{MessageId: "msg1"}) }()
	time.Sleep(50 * time.Millisecond) // msg1 has failed once and is waiting
	go func() { defer wg.Done(); _ = h(context.Background(), &amqp.Delivery{MessageId: "msg2"}) }()
	wg.Wait()

	want := []string{"msg1 handled", "msg2 handled", "msg1 handled", "msg1 handled"}
	if len(events) != len(want) {
		t.Fatalf("events = %v, want %v", events, want)
	}
	for i := range want {
		if events[i] != want[i] {
			t.Fatalf("events = %v, want %v: msg2 waited for msg1's retries", events, want)
		}
	}
}

type countingHook struct{ n int }

func (p *countingHook) WillWait() { p.n++ }

func TestWillWaitIsCalledBeforeEveryWait(t *testing.T) {
	p := &countingHook{}
	ctx := chainctx.WithWaitHook(context.Background(), p)
	h := &failingHandler{failures: 100, err: errBoom}
	r := &recordingRecoverer{}
	_ = middleware.Chain(middleware.Retry(4, middleware.WithClock(middleware.NewFakeClock())), middleware.Recover(r))(h.Handle)(ctx, &amqp.Delivery{})
	// three backoffs, then the recoverer
	if p.n != 4 {
		t.Fatalf("WillWait called %d times, want 4 (3 waits and 1 recovery)", p.n)
	}
	p.n = 0
	_ = middleware.Chain(middleware.Retry(4), middleware.Recover(r))(func(context.Context, *amqp.Delivery) error { return nil })(ctx, &amqp.Delivery{})
	if p.n != 0 {
		t.Fatalf("WillWait called %d times on success, want 0", p.n)
	}
	chainrun.WillWait(context.Background()) // no hook: nothing happens
}

// A context type of one's own (the listener's) can carry the hook without
// WithWaitHook.
type hookContext struct {
	context.Context
	p chainctx.WaitHook
}

func (c hookContext) Value(key any) any {
	if key == chainctx.WaitHookKey {
		return c.p
	}
	return c.Context.Value(key)
}

func TestWaitHookKey(t *testing.T) {
	p := &countingHook{}
	chainrun.WillWait(hookContext{context.Background(), p})
	if p.n != 1 {
		t.Fatalf("WillWait called the hook %d times, want 1", p.n)
	}
}
