package outbox

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/amqpretry/amqpretry/outbox/internal/pgsql"
)

// DefaultTable is the table New uses without WithTable.
const DefaultTable = "amqpretry_outbox"

// Option configures an Outbox (New) or one of its relays (Relay).
type Option func(*config)

type config struct {
	table          pgsql.Table
	maxTries       int
	initialBackoff time.Duration
	maxBackoff     time.Duration
	batchSize      int
	maxBatchBytes  int64
	concurrency    int
	workers        int
	pollInterval   time.Duration
	publishTimeout time.Duration
	lease          time.Duration // 0: publishTimeout + defaultLeaseSlack
	shutdown       time.Duration
	frameMax       int
	retention      time.Duration
	cleanupEvery   time.Duration
	logger         *slog.Logger
	errs           []error
}

func defaultConfig() config {
	t, _ := pgsql.ParseTable(DefaultTable)
	return config{
		table:          t,
		maxTries:       10,
		initialBackoff: time.Second,
		maxBackoff:     5 * time.Minute,
		batchSize:      500,
		maxBatchBytes:  64 << 20,
		workers:        2,
		pollInterval:   50 * time.Millisecond,
		publishTimeout: 30 * time.Second,
		shutdown:       5 * time.Second,
		frameMax:       131072,
		retention:      24 * time.Hour,
		cleanupEvery:   time.Minute,
	}
}

func (c *config) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("outbox: "+format, args...))
}

func (c *config) err() error {
	errs := c.errs
	if c.lease != 0 && c.lease < c.publishTimeout+leaseMargin {
		errs = append(errs, fmt.Errorf("outbox: WithLease(%v): want at least the publish timeout (%v) plus %v, to publish and record a row within its lease", c.lease, c.publishTimeout, leaseMargin))
	}
	return errors.Join(errs...)
}

// defaultLeaseSlack is what the default lease adds to the publish timeout:
// room to claim, wait for a concurrency slot and record the outcome.
const defaultLeaseSlack = 30 * time.Second

// leaseMargin is the least time a claim keeps, past a publish's timeout, to
// record its outcome: a publish that would end later is not started.
const leaseMargin = time.Second

// leaseFor is the lease a claim takes.
func (c *config) leaseFor() time.Duration {
	if c.lease != 0 {
		return c.lease
	}
	return c.publishTimeout + defaultLeaseSlack
}

// WithTable names the outbox table, optionally schema-qualified
// ("app.outbox"): lowercase letters, digits and _, the table part at most 48
// bytes. Default DefaultTable.
func WithTable(name string) Option {
	return func(c *config) {
		t, err := pgsql.ParseTable(name)
		if err != nil {
			c.fail("WithTable: %v", err)
			return
		}
		c.table = t
	}
}

// WithMaxTries sets how many failed publishes make a row failed, awaiting a
// person (Retry). Default 10; with the default backoff the tenth failure
// comes about 8.5 minutes after the first.
func WithMaxTries(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.fail("WithMaxTries(%d): a row needs at least one try", n)
			return
		}
		c.maxTries = n
	}
}

// WithRetryBackoff sets the wait after a row's failed publish: initial after
// the first, doubling per failure, capped at max. Default 1s to 5m.
func WithRetryBackoff(initial, max time.Duration) Option {
	return func(c *config) {
		if initial <= 0 || max < initial {
			c.fail("WithRetryBackoff(%v, %v): want 0 < initial <= max", initial, max)
			return
		}
		c.initialBackoff, c.maxBackoff = initial, max
	}
}

// WithBatchSize sets how many rows a relay worker claims per transaction.
// Default 500.
func WithBatchSize(n int) Option {
	return func(c *config) {
		if n < 1 || n > 10000 {
			c.fail("WithBatchSize(%d): want 1 to 10000", n)
			return
		}
		c.batchSize = n
	}
}

// WithMaxBatchBytes bounds the message bytes (bodies and properties) a relay
// worker holds at once: a batch of large messages is cut short, to one row
// at least, and the rest wait for the next pass. Default 64 MiB.
func WithMaxBatchBytes(n int64) Option {
	return func(c *config) {
		if n < 1 {
			c.fail("WithMaxBatchBytes(%d): want a positive number of bytes", n)
			return
		}
		c.maxBatchBytes = n
	}
}

// WithConcurrency caps the publishes each relay worker has awaiting their
// confirms at once. Default: the batch size. Through a *publisher.Publisher
// it is at most the publisher's WithMaxInFlight (1024 by default) shared
// out among the workers. WithWorkers(1) with
// WithConcurrency(1) publishes strictly in id order, one confirm at a time,
// at a fraction of the throughput.
func WithConcurrency(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.fail("WithConcurrency(%d): want at least 1", n)
			return
		}
		c.concurrency = n
	}
}

// WithWorkers sets how many loops a relay runs, each claiming, publishing
// and recording its own batches: with two, one batch is published while the
// last is recorded. Default 2.
func WithWorkers(n int) Option {
	return func(c *config) {
		if n < 1 || n > 64 {
			c.fail("WithWorkers(%d): want 1 to 64", n)
			return
		}
		c.workers = n
	}
}

// WithPollInterval sets how long a relay that found nothing to send waits
// before it looks again: the bulk of the delay between a commit and its
// publish. Default 50ms.
func WithPollInterval(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail("WithPollInterval(%v): want a positive duration", d)
			return
		}
		c.pollInterval = d
	}
}

// WithPublishTimeout bounds one publish, confirm included; past it the
// publish counts as a failed try, unless the publisher had no connection to
// the broker (then it counts none). Default 30s.
func WithPublishTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail("WithPublishTimeout(%v): want a positive duration", d)
			return
		}
		c.publishTimeout = d
	}
}

// WithLease sets how long a relay's claim on a batch of rows lasts. A relay
// claims rows in a short transaction of their own, publishes them with no
// transaction open, and records the outcomes in another; while the lease
// lasts no other relay takes the rows, and once it lapses (the relay died,
// froze, or lost its database connection) any relay may, and the first
// relay's late outcomes are no longer recorded. So it bounds how long a row
// waits after its relay is gone, and must exceed the publish timeout by a
// second at least: each publish's timeout is cut to end a second before its
// lease does, and a row with less than half the publish timeout left (it
// waited long for a WithConcurrency slot) is handed back untried, with a
// warning. Default: the publish timeout plus 30s (a minute by default).
func WithLease(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail("WithLease(%v): want a positive duration", d)
			return
		}
		c.lease = d
	}
}

// WithShutdownTimeout bounds how long Run, once its context has ended,
// waits for the confirms of the publishes it has already sent; it starts no
// new publish. The confirms that came in are recorded as they arrive, and
// the rows not confirmed are handed back, due at once for the next relay:
// that writing takes up to 5s more when the database is slow. 0 waits for
// no confirm. Default 5s.
func WithShutdownTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.fail("WithShutdownTimeout(%v): want 0 or a positive duration", d)
			return
		}
		c.shutdown = d
	}
}

// WithFrameMax sets the frame_max of the broker the messages go to, for
// Enqueue to refuse properties and headers that could not fit one frame
// (the publisher would refuse the row at every try). Default 131072,
// RabbitMQ's default; set it when the broker's frame_max is lower.
func WithFrameMax(n int) Option {
	return func(c *config) {
		if n < 4096 {
			c.fail("WithFrameMax(%d): AMQP frames are at least 4096 bytes", n)
			return
		}
		c.frameMax = n
	}
}

// WithRetention sets how long sent rows are kept before a relay deletes
// them; 0 keeps them. Failed and in-flight rows are never deleted. Default
// 24h.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.fail("WithRetention(%v): want 0 (keep) or a positive duration", d)
			return
		}
		c.retention = d
	}
}

// WithCleanupInterval sets how often a relay deletes sent rows past the
// retention. Default 1m.
func WithCleanupInterval(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail("WithCleanupInterval(%v): want a positive duration", d)
			return
		}
		c.cleanupEvery = d
	}
}

// WithLogger sets the logger. Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.fail("WithLogger(nil): pass a logger, or leave the option out for slog.Default()")
			return
		}
		c.logger = l
	}
}
