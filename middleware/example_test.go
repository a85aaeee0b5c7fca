package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// Retry(5) makes at most five attempts, the first call included, and waits
// 1s, 2s, 4s, 8s between them by default; this example shortens the waits.
func ExampleRetry() {
	handle := func(ctx context.Context, d *amqp.Delivery) error {
		fmt.Printf("attempt %d: %s\n", middleware.Attempt(ctx), d.Body)
		if middleware.Attempt(ctx) < 3 {
			return errors.New("database busy")
		}
		return nil
	}
	retry := middleware.Retry(5,
		middleware.WithInitialInterval(time.Millisecond),
		middleware.OnRetry(func(_ context.Context, e middleware.RetryEvent) {
			fmt.Printf("  failed (%v), next attempt in %v\n", e.Err, e.Delay)
		}),
	)
	err := retry(handle)(context.Background(), &amqp.Delivery{Body: []byte("order 42")})
	fmt.Println("result:", err)
	// Output:
	// attempt 1: order 42
	//   failed (database busy), next attempt in 1ms
	// attempt 2: order 42
	//   failed (database busy), next attempt in 2ms
	// attempt 3: order 42
	// result: <nil>
}

// The usual chain: retry locally, then hand the message to a recoverer (in
// production a recoverer.Republisher that publishes to a dead-letter exchange
// and waits for the broker's confirm).
func ExampleRecover() {
	dlq := middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
		fmt.Printf("to the DLQ after attempt %d: %s (%v)\n", middleware.Attempt(ctx), d.Body, cause)
		return nil
	})
	chain := middleware.Chain(
		middleware.Retry(3, middleware.WithInitialInterval(time.Millisecond)),
		middleware.Recover(dlq),
	)
	h := chain(func(context.Context, *amqp.Delivery) error { return errors.New("no such customer") })
	err := h(context.Background(), &amqp.Delivery{Body: []byte("msg1")})
	fmt.Println("settlement:", chainrun.SettlementFor(err))
	// Output:
	// to the DLQ after attempt 3: msg1 (no such customer)
	// settlement: ack
}

// A Permanent error is not retried: a malformed message will not parse on the
// second attempt either.
func ExamplePermanent() {
	calls := 0
	handle := func(context.Context, *amqp.Delivery) error {
		calls++
		return middleware.Permanent(errors.New("invalid JSON"))
	}
	err := middleware.Retry(5)(handle)(context.Background(), &amqp.Delivery{})
	fmt.Println(calls, "call;", err, ";", chainrun.SettlementFor(err))
	// Output: 1 call; invalid JSON ; reject
}

func ExampleChain() {
	logging := func(next middleware.Handler) middleware.Handler {
		return func(ctx context.Context, d *amqp.Delivery) error {
			err := next(ctx, d)
			fmt.Printf("handled %s: %v\n", d.MessageId, err)
			return err
		}
	}
	// logging is outermost: it sees the final result, after all retries.
	h := middleware.Chain(logging, middleware.Retry(2, middleware.WithInitialInterval(time.Millisecond)))(
		func(context.Context, *amqp.Delivery) error { return errors.New("timeout") })
	_ = h(context.Background(), &amqp.Delivery{MessageId: "m-1"})
	// Output: handled m-1: middleware: retries exhausted after 2 attempts: timeout
}

// Each class of error gets its own schedule: a timeout five quick attempts,
// a validation error none, the rest Retry's own three. The first rule
// whose class matches decides, and the dead letter and the spans name it.
func ExampleRetryOn() {
	errTimeout := errors.New("payment service timed out")
	errInvalid := errors.New("no such customer")
	timeouts := middleware.ErrorIs("timeout", errTimeout, context.DeadlineExceeded)
	invalid := middleware.ErrorIs("validation", errInvalid)

	retry := middleware.Retry(3,
		middleware.RetryOn(timeouts, 5, middleware.WithInitialInterval(time.Millisecond)),
		middleware.NoRetryOn(invalid),
	)
	dlq := middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
		n, _ := chainrun.AttemptsMade(cause)
		fmt.Printf("%s: to the DLQ after %d attempt(s), rule %q: %v\n", d.Body, n, middleware.RuleApplied(ctx, cause), chainrun.HandlerError(cause))
		return nil
	})
	chain := middleware.Chain(middleware.Recover(dlq), retry)
	for i, err := range []error{errTimeout, errInvalid} {
		body := fmt.Sprintf("order %d", i+1)
		_ = chain(func(context.Context, *amqp.Delivery) error { return err })(context.Background(), &amqp.Delivery{Body: []byte(body)})
	}
	// Output:
	// order 1: to the DLQ after 5 attempt(s), rule "timeout": payment service timed out
	// order 2: to the DLQ after 1 attempt(s), rule "validation": no such customer
}
