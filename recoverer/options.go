package recoverer

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Option configures Republish.
type Option func(*config)

type config struct {
	stackTrace     bool
	headroom       int
	extra          []func(context.Context, *amqp.Delivery, error) amqp.Table
	prefix         string
	publishTimeout time.Duration
	errs           []error
}

func defaultConfig() config {
	return config{stackTrace: true, headroom: DefaultHeadroom, prefix: DefaultHeaderPrefix, publishTimeout: 30 * time.Second}
}

// validate reports every invalid option, not just the first.
func (c config) validate() error { return errors.Join(c.errs...) }

// WithStackTrace turns x-exception-stacktrace on (the default) or off. Stacks
// and error chains can reveal internals; see the package documentation.
func WithStackTrace(on bool) Option {
	return func(c *config) { c.stackTrace = on }
}

// WithHeadroom sets how many bytes of the frame are kept free for the other
// properties. Default 20,000.
func WithHeadroom(bytes int) Option {
	return func(c *config) {
		if bytes < 0 || bytes > 1<<20 {
			c.errs = append(c.errs, fmt.Errorf("recoverer: WithHeadroom expects 0 to 1048576 bytes, got %d", bytes))
		}
		c.headroom = bytes
	}
}

// WithHeaders adds headers of your own to every copy, computed from the
// delivery and the error. They count against the frame budget. Several
// WithHeaders all apply, in order; a later one wins on a shared name.
func WithHeaders(f func(ctx context.Context, d *amqp.Delivery, cause error) amqp.Table) Option {
	return func(c *config) {
		if f == nil {
			c.errs = append(c.errs, errors.New("recoverer: WithHeaders expects a non-nil function"))
		}
		c.extra = append(c.extra, f)
	}
}

// WithHeaderPrefix replaces DefaultHeaderPrefix in the names of our fault
// headers (the Spring ones keep their names).
func WithHeaderPrefix(prefix string) Option {
	return func(c *config) {
		if len(prefix) > 200 {
			c.errs = append(c.errs, fmt.Errorf("recoverer: WithHeaderPrefix expects at most 200 bytes (header names are limited to 255), got %d", len(prefix)))
		}
		c.prefix = prefix
	}
}

// WithPublishTimeout bounds how long Recover waits for the publish and its
// confirm, an outage included; past it the original is requeued. Default 30s.
func WithPublishTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("recoverer: WithPublishTimeout expects a duration > 0, got %v", d))
		}
		c.publishTimeout = d
	}
}
