package dlx

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// RetryCount is the package's RetryCount narrowed to this topology: without
// an x-retry-count header, only x-death expiries in its own retry queues
// count.
func (t Topology) RetryCount(d *amqp.Delivery) int {
	if d == nil {
		return 0
	}
	if n, ok := amqphdr.Count(d.Headers[RetryCountHeader]); ok {
		return n
	}
	ours := map[string]bool{t.SingleRetryQueue(): t.SingleRetryDelay > 0}
	for _, delay := range t.RetryDelays {
		ours[t.RetryQueue(delay)] = true
	}
	total := 0
	for _, death := range Deaths(d) {
		if death.Reason == "expired" && ours[death.Queue] {
			total = min(total+death.Count, amqphdr.MaxCount)
		}
	}
	return total
}

// TierRecoverer is a middleware.Recoverer that parks failed messages in the
// topology's retry tiers and, past the limit, on its DLQ.
type TierRecoverer struct {
	t     Topology
	max   int
	tiers []*recoverer.Republisher // one per RetryDelays entry
	dlq   *recoverer.Republisher
}

var _ middleware.Recoverer = (*TierRecoverer)(nil)

// TierOption configures Tiers.
type TierOption func(*tierConfig)

type tierConfig struct {
	max  int
	opts []recoverer.Option
}

// MaxRetries sets how many broker-side retries a message gets before the DLQ.
// Default: one per tier. Past the last tier, retries reuse the last delay.
func MaxRetries(n int) TierOption { return func(c *tierConfig) { c.max = n } }

// WithRepublishOptions passes options (stack trace, headroom, extra headers,
// prefix — give Replay the same one with ReplayHeaderPrefix) to the
// recoverer.Republish that writes the fault headers.
func WithRepublishOptions(opts ...recoverer.Option) TierOption {
	return func(c *tierConfig) { c.opts = append(c.opts, opts...) }
}

// Tiers returns the recoverer for the topology's retry tiers. For a message on
// its k-th broker retry (RetryCount, 0 for a fresh one) it publishes a copy to
// tier min(k, last) with x-retry-count k+1 and the fault headers of the error,
// and returns once the broker has confirmed it, so the original may be acked.
// From MaxRetries on, and for Permanent errors at once, the copy goes to the
// DLQ instead. It composes with local retries:
//
//	middleware.Chain(middleware.Retry(3), middleware.Recover(topo.Tiers(pub)))
//
// makes three quick local attempts, then the tiers, then the DLQ. A copy
// on a tier has no per-message expiration (a TTL shorter than the tier's
// would cut its wait short): the message's own is kept in the
// x-amqpretry-original-expiration header, and a retried message no longer
// expires on its work queue. Tiers
// panics if the topology is invalid or has no RetryDelays, if pub is nil, or
// if a MaxRetries or WithRepublishOptions value is invalid, naming every
// problem at once.
func (t Topology) Tiers(pub recoverer.Publisher, opts ...TierOption) *TierRecoverer {
	cfg := tierConfig{max: len(t.RetryDelays)}
	for _, opt := range opts {
		opt(&cfg)
	}
	errs := []error{t.Validate()}
	if len(t.RetryDelays) == 0 {
		errs = append(errs, errors.New("dlx: Tiers needs Topology.RetryDelays"))
	}
	if cfg.max < 0 {
		errs = append(errs, fmt.Errorf("dlx: MaxRetries expects n >= 0, got %d", cfg.max))
	}
	r := &TierRecoverer{t: t, max: cfg.max}
	keep := recoverer.WithHeaders(func(_ context.Context, d *amqp.Delivery, _ error) amqp.Table {
		return amqp.Table{RetryCountHeader: int64(t.RetryCount(d))}
	})
	var err error
	r.dlq, err = republish(pub, t.DLX(), t.DLQRoutingKey(), append(cfg.opts[:len(cfg.opts):len(cfg.opts)], keep))
	errs = append(errs, err)
	next := recoverer.WithHeaders(func(_ context.Context, d *amqp.Delivery, _ error) amqp.Table {
		return amqp.Table{RetryCountHeader: int64(t.RetryCount(d) + 1)}
	})
	if err == nil { // the tiers share the DLQ's publisher and options: name their problems once
		for _, delay := range t.RetryDelays {
			// Straight to the tier queue through the default exchange.
			tier, tierErr := republish(pub, "", t.RetryQueue(delay), append(cfg.opts[:len(cfg.opts):len(cfg.opts)], next))
			errs = append(errs, tierErr)
			r.tiers = append(r.tiers, tier)
		}
	}
	if err := errors.Join(errs...); err != nil {
		panic(err.Error())
	}
	return r
}

// republish is recoverer.Republish with its panic, which names every bad
// argument, returned as an error, so that Tiers names them with its own.
func republish(pub recoverer.Publisher, exchange, key string, opts []recoverer.Option) (r *recoverer.Republisher, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	return recoverer.Republish(pub, exchange, key, opts...), nil
}

// Recover publishes d to its next tier, or to the DLQ, and returns after the
// broker's confirm.
func (r *TierRecoverer) Recover(ctx context.Context, d *amqp.Delivery, cause error) error {
	k := r.t.RetryCount(d)
	if k >= r.max || middleware.IsPermanent(cause) {
		return r.dlq.Recover(ctx, d, cause)
	}
	return r.tiers[min(k, len(r.tiers)-1)].Recover(chainctx.WithRetryHop(ctx), d, cause)
}

// NextDelay is the tier delay d would wait on its next broker retry, or 0
// when it would go to the DLQ.
func (r *TierRecoverer) NextDelay(d *amqp.Delivery) time.Duration {
	k := r.t.RetryCount(d)
	if k >= r.max {
		return 0
	}
	return r.t.RetryDelays[min(k, len(r.t.RetryDelays)-1)]
}

// RejectToRetry is the recoverer of the single-delay layout (SingleRetryDelay):
// below maxRetries it has the listener reject the message, and the broker
// moves it to the retry queue and back atomically, no publisher needed. The
// count comes from the x-death entries the broker writes for rejections from
// the work queue. From maxRetries on, and for Permanent errors at once, final
// decides, and it must take the message out of the loop itself: in this
// layout the work queue dead-letters every rejection into its retry queue, so
// a rejection never reaches the DLQ. Use
//
//	topo.RejectToRetry(n, recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey()))
//
// to park it on the DLQ, or recoverer.Requeue() to keep it on the work queue.
// When final asks for a rejection (middleware.ErrReject: recoverer.Reject(),
// say), RejectToRetry returns an error that does not match ErrReject and says
// so, and the listener requeues the message, with its delay, instead of
// sending it round the loop forever. Its own rejections, the retries, have a
// RetriesThroughDeadLetters() bool method that returns true, so that the
// listener tells them from a rejection that loops by mistake. RejectToRetry panics if the topology is
// invalid or has no SingleRetryDelay, if maxRetries is negative or final nil.
func (t Topology) RejectToRetry(maxRetries int, final middleware.Recoverer) middleware.Recoverer {
	errs := []error{t.Validate()}
	if t.SingleRetryDelay <= 0 {
		errs = append(errs, errors.New("dlx: RejectToRetry needs Topology.SingleRetryDelay"))
	}
	if maxRetries < 0 {
		errs = append(errs, fmt.Errorf("dlx: RejectToRetry expects maxRetries >= 0, got %d", maxRetries))
	}
	if final == nil {
		errs = append(errs, errors.New("dlx: RejectToRetry expects a final Recoverer"))
	}
	if err := errors.Join(errs...); err != nil {
		panic(err.Error())
	}
	return middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
		rejected := rejections(d, t.Queue)
		if rejected < maxRetries && !middleware.IsPermanent(cause) {
			return &retryRejection{fmt.Sprintf("dlx: retry %d of %d through %s: %v", rejected+1, maxRetries, t.SingleRetryQueue(), middleware.ErrReject)}
		}
		err := final.Recover(ctx, d, cause)
		if errors.Is(err, middleware.ErrReject) {
			// Not wrapped: matching ErrReject would have the listener reject it.
			return fmt.Errorf("dlx: RejectToRetry's final recoverer asked for a rejection (%v), but %s dead-letters every rejection into %s, "+
				"which sends it back, so the message would loop forever instead of reaching the DLQ: it is requeued instead; "+
				"make final a recoverer that publishes it, recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey()), here to exchange %q with key %q",
				err, t.Queue, t.SingleRetryQueue(), t.DLX(), t.DLQRoutingKey())
		}
		return err
	})
}

// retryRejection is RejectToRetry's rejection below maxRetries: one that is
// meant to come back.
type retryRejection struct{ msg string }

func (e *retryRejection) Error() string { return e.msg }
func (e *retryRejection) Unwrap() error { return middleware.ErrReject }

// RetriesThroughDeadLetters tells the listener, which looks for the method
// with errors.As, that the message will come back to its queue on purpose:
// a rejection it must not report as a loop.
func (e *retryRejection) RetriesThroughDeadLetters() bool { return true }

// RejectedFrom reports whether the broker has dead-lettered d out of queue
// because a consumer rejected it (an x-death entry with that queue and
// reason "rejected"). For a delivery consumed from queue, that means it came
// back after a rejection: queue dead-letters into a queue that returns its
// messages, as the single-delay layout's work queue does (SingleRetryDelay),
// and rejecting it again would send it round once more rather than to a DLQ.
func RejectedFrom(d *amqp.Delivery, queue string) bool {
	for _, death := range Deaths(d) {
		if death.Queue == queue && death.Reason == "rejected" {
			return true
		}
	}
	return false
}

// rejections counts the rejections the broker recorded for d in queue.
func rejections(d *amqp.Delivery, queue string) int {
	n := 0
	for _, death := range Deaths(d) {
		if death.Queue == queue && death.Reason == "rejected" {
			n = min(n+death.Count, amqphdr.MaxCount)
		}
	}
	return n
}
