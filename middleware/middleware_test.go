package middleware_test

import (
	"context"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
)

// tag returns a middleware that appends name to the trace before and after next.
func tag(name string, trace *[]string) middleware.Middleware {
	return func(next middleware.Handler) middleware.Handler {
		return func(ctx context.Context, d *amqp.Delivery) error {
			*trace = append(*trace, name+">")
			err := next(ctx, d)
			*trace = append(*trace, "<"+name)
			return err
		}
	}
}

func TestChainOrder(t *testing.T) {
	tests := []struct {
		name string
		mws  []string
		want string
	}{
		{"identity", nil, "h"},
		{"one", []string{"a"}, "a> h <a"},
		{"first is outermost", []string{"a", "b", "c"}, "a> b> c> h <c <b <a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var trace []string
			var mws []middleware.Middleware
			for _, n := range tt.mws {
				mws = append(mws, tag(n, &trace))
			}
			h := middleware.Chain(mws...)(func(context.Context, *amqp.Delivery) error {
				trace = append(trace, "h")
				return nil
			})
			if err := h(context.Background(), &amqp.Delivery{}); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(trace, " "); got != tt.want {
				t.Errorf("trace = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestChainCopiesItsArguments(t *testing.T) {
	var trace []string
	mws := []middleware.Middleware{tag("a", &trace)}
	chain := middleware.Chain(mws...)
	mws[0] = tag("changed", &trace)
	_ = chain(func(context.Context, *amqp.Delivery) error { return nil })(context.Background(), &amqp.Delivery{})
	if got := strings.Join(trace, " "); got != "a> <a" {
		t.Errorf("trace = %q: Chain must not see later changes to the caller's slice", got)
	}
}

func TestChainPanicsOnNil(t *testing.T) {
	defer expectPanic(t, "middleware: Chain expects non-nil middlewares, got nil at index 1")
	middleware.Chain(middleware.CatchPanics(), nil)
}

func expectPanic(t *testing.T, want string) {
	t.Helper()
	v := recover()
	if v == nil {
		t.Fatalf("no panic, want %q", want)
	}
	if got, _ := v.(string); got != want {
		t.Fatalf("panic = %v, want %q", v, want)
	}
}
