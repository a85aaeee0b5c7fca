package recoverer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/pubtest"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/recoverer"
)

var (
	errTimeout    = errors.New("upstream timeout")
	errValidation = errors.New("invalid order")
	errFraud      = errors.New("fraud suspected")

	timeouts = middleware.ErrorIs("timeout", errTimeout)
	invalid  = middleware.ErrorIs("validation", errValidation)
	fraud    = middleware.ErrorFunc("fraud", func(err error) bool { return errors.Is(err, errFraud) })
)

// to is a recoverer that records its name where the failure went.
func to(name string, went *string, err error) middleware.Recoverer {
	return middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error {
		*went = name
		return err
	})
}

func TestByErrorRoutes(t *testing.T) {
	errPublish := errors.New("publish nacked")
	var went string
	r := recoverer.ByError(to("dlq", &went, nil),
		recoverer.When(fraud, to("fraud", &went, nil)),
		recoverer.When(invalid, to("invalid", &went, errPublish)),
		recoverer.When(middleware.ErrorIs("both", errFraud, errValidation), to("never reached", &went, nil)),
	)
	tests := []struct {
		name    string
		cause   error
		want    string
		wantErr error
	}{
		{"a class's failure", errFraud, "fraud", nil},
		{"wrapped by Retry", &middleware.RetriesExhaustedError{Attempts: 5, Last: fmt.Errorf("charge: %w", errFraud)}, "fraud", nil},
		{"Permanent", middleware.Permanent(errValidation), "invalid", errPublish},
		{"the first route that matches", errors.Join(errValidation, errFraud), "fraud", nil},
		{"no route: otherwise", errTimeout, "dlq", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			went = ""
			err := r.Recover(context.Background(), &amqp.Delivery{}, tt.cause)
			if went != tt.want || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("went to %q with %v, want %q with %v", went, err, tt.want, tt.wantErr)
			}
		})
	}
}

// The listener settles what the chosen recoverer asks: a Reject route
// rejects, a Requeue route requeues.
func TestByErrorSettlement(t *testing.T) {
	var went string
	r := recoverer.ByError(to("dlq", &went, nil),
		recoverer.When(invalid, recoverer.Reject()),
		recoverer.When(timeouts, recoverer.Requeue()))
	for cause, want := range map[error]chainrun.Settlement{errValidation: chainrun.Reject, errTimeout: chainrun.Requeue, errFraud: chainrun.Ack} {
		err := middleware.Chain(retryFast(2), middleware.Recover(r))(failing(cause))(context.Background(), &amqp.Delivery{})
		if got := chainrun.SettlementFor(err); got != want {
			t.Errorf("%v: settled %v (%v), want %v", cause, got, err, want)
		}
	}
}

func TestByErrorInvalid(t *testing.T) {
	defer func() {
		want := "recoverer: ByError expects a non-nil Recoverer for the failures no route takes\n" +
			"recoverer: ByError expects routes made by When with an ErrorClass of middleware.ErrorIs, ErrorAs or ErrorFunc, got the zero ErrorClass at index 0\n" +
			`recoverer: ByError expects routes to non-nil recoverers, got nil at index 1 ("fraud")`
		if got := recover(); got != want {
			t.Fatalf("panic %v, want %q", got, want)
		}
	}()
	recoverer.ByError(nil, recoverer.When(middleware.ErrorClass{}, recoverer.Reject()), recoverer.When(fraud, nil))
}

// The dead letter names the rule that applied, from inside Retry or from
// around it, and only when the Retry has rules; a header left by an
// earlier failure does not survive one without.
func TestRetryRuleHeader(t *testing.T) {
	withRules := middleware.Retry(3, middleware.WithInitialInterval(time.Millisecond),
		middleware.RetryOn(timeouts, 2, middleware.WithInitialInterval(time.Millisecond)),
		middleware.NoRetryOn(invalid))
	tests := []struct {
		name  string
		chain func(middleware.Recoverer) middleware.Middleware
		cause error
		old   amqp.Table
		want  any
	}{
		{"inside Retry: a rule", func(r middleware.Recoverer) middleware.Middleware {
			return middleware.Chain(withRules, middleware.Recover(r))
		},
			errTimeout, nil, "timeout"},
		{"outside Retry: a rule", func(r middleware.Recoverer) middleware.Middleware {
			return middleware.Chain(middleware.Recover(r), withRules)
		},
			errValidation, nil, "validation"},
		{"Retry's own schedule", func(r middleware.Recoverer) middleware.Middleware {
			return middleware.Chain(withRules, middleware.Recover(r))
		},
			errFraud, nil, "default"},
		{"a Retry without rules", func(r middleware.Recoverer) middleware.Middleware {
			return middleware.Chain(retryFast(2), middleware.Recover(r))
		},
			errTimeout, amqp.Table{"x-amqpretry-retry-rule": "timeout"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := &pubtest.Publisher{}
			rep := recoverer.Republish(pub, "orders.dlx", "")
			if err := tt.chain(rep)(failing(tt.cause))(context.Background(), &amqp.Delivery{Headers: tt.old}); err != nil {
				t.Fatal(err)
			}
			h := pub.Sent()[0].Msg.Headers
			if got := h["x-amqpretry-"+recoverer.SuffixRetryRule]; got != tt.want {
				t.Errorf("retry-rule header %v, want %v", got, tt.want)
			}
		})
	}
}
