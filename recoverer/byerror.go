package recoverer

import (
	"context"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
)

// Route sends the failures of one class of errors to a recoverer of their
// own; When builds one.
type Route struct {
	class middleware.ErrorClass
	to    middleware.Recoverer
}

// When routes the failures whose error belongs to class to the recoverer to.
func When(class middleware.ErrorClass, to middleware.Recoverer) Route {
	return Route{class: class, to: to}
}

// ByError returns a Recoverer that hands each failure to the recoverer of
// the first route, in the order given, whose class its error belongs to,
// and the rest to otherwise: a dead-letter queue per class of failure, a
// Reject for the ones the queue's own DLX should take, a Requeue for the
// ones that must not leave. The classes are those of middleware.RetryOn, so
// one set of classes decides both how often a failure is retried and where
// it goes after:
//
//	recoverer.ByError(recoverer.Republish(pub, "orders.dlx", "orders"),
//		recoverer.When(fraud, recoverer.Republish(pub, "", "orders.fraud")),
//		recoverer.When(invalid, recoverer.Reject()),
//	)
//
// The error is matched as the recoverer receives it: wrapped by Retry
// (ErrRetriesExhausted unwraps to the last attempt's error) or Permanent,
// which errors.Is and errors.As see through. What the chosen recoverer
// returns is the outcome, as if it were the only one: nil means the message
// is safe there, an error that it is not (the listener requeues it).
//
// ByError panics if otherwise is nil, or a route has a nil recoverer or the
// zero ErrorClass, naming each.
func ByError(otherwise middleware.Recoverer, routes ...Route) middleware.Recoverer {
	var problems []string
	if otherwise == nil {
		problems = append(problems, "recoverer: ByError expects a non-nil Recoverer for the failures no route takes")
	}
	for i, r := range routes {
		if r.class.Name() == "" {
			problems = append(problems, fmt.Sprintf("recoverer: ByError expects routes made by When with an ErrorClass of middleware.ErrorIs, ErrorAs or ErrorFunc, got the zero ErrorClass at index %d", i))
		}
		if r.to == nil {
			problems = append(problems, fmt.Sprintf("recoverer: ByError expects routes to non-nil recoverers, got nil at index %d (%q)", i, r.class.Name()))
		}
	}
	if len(problems) > 0 {
		panic(strings.Join(problems, "\n"))
	}
	return &errorRouter{routes: append([]Route(nil), routes...), otherwise: otherwise}
}

type errorRouter struct {
	routes    []Route
	otherwise middleware.Recoverer
}

func (r *errorRouter) Recover(ctx context.Context, d *amqp.Delivery, cause error) error {
	for _, route := range r.routes {
		if route.class.Matches(cause) {
			return route.to.Recover(ctx, d, cause)
		}
	}
	return r.otherwise.Recover(ctx, d, cause)
}
