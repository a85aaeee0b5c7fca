package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The retry section runs on a RabbitMQ 4.3 broker of its own (-retry-url):
// a flood in which every message fails twice and then succeeds, through the
// broker's own delayed retry (a quorum queue that holds a rejected delivery
// before it delivers it again), through TTL retry tiers, and through local
// retries, each library variant beside an amqp091-go loop doing the same on
// the same queues. Every wait is the same 100 ms, so what differs is the
// cost of getting a failed message back.
const (
	retryDelay = 100 * time.Millisecond
	// retryFailures is how often each message fails before it succeeds.
	retryFailures = 2
	// retryLimit is the broker's redeliveries and the tiers' retries: more
	// than retryFailures, so that no message of the flood reaches the DLQ.
	retryLimit = 5
	// retryTimedMessages is about how many messages per run have their waits
	// timed: every k-th message id, k = messages / retryTimedMessages.
	retryTimedMessages = 500
)

// errFlaky is what a handler of the flood returns on a failing attempt.
var errFlaky = errors.New("bench: flaky message, fails twice then succeeds")

// RetryResult is the retry section: the flood, the waits as the handler saw
// them, and the broker's memory with messages parked in a long delay.
type RetryResult struct {
	URL    string `json:"url"`              // the password hidden
	Broker string `json:"broker,omitempty"` // "RabbitMQ 4.3.6"
	// Skipped says why the section did not run (no broker, too old).
	Skipped  string         `json:"skipped,omitempty"`
	DelayMS  float64        `json:"delay_ms"`
	Failures int            `json:"failures_per_message"`
	Flood    *Comparison    `json:"flood,omitempty"`
	Waits    []WaitAccuracy `json:"wait_accuracy,omitempty"`
	Parked   *ParkedMemory  `json:"parked,omitempty"`
	Goals    []Goal         `json:"goals,omitempty"`
}

// WaitAccuracy is how far the waits between a failed attempt and the next
// attempt of the same message strayed from the configured delay, over every
// timed message of every round of one variant. Errors are measured minus
// configured, in milliseconds.
type WaitAccuracy struct {
	Variant      string  `json:"variant"`
	Waits        int     `json:"waits"`
	ConfiguredMS float64 `json:"configured_ms"`
	MinErrMS     float64 `json:"min_error_ms"`
	MedianErrMS  float64 `json:"median_error_ms"`
	P95ErrMS     float64 `json:"p95_error_ms"`
	MaxErrMS     float64 `json:"max_error_ms"`
}

// waitAccuracy summarises measured waits against the configured one; false
// when there are none.
func waitAccuracy(variant string, waits []time.Duration, configured time.Duration) (WaitAccuracy, bool) {
	if len(waits) == 0 {
		return WaitAccuracy{}, false
	}
	errs := make([]float64, len(waits))
	for i, w := range waits {
		errs[i] = ms(w - configured)
	}
	slices.Sort(errs)
	return WaitAccuracy{
		Variant: variant, Waits: len(errs), ConfiguredMS: ms(configured),
		MinErrMS: errs[0], MedianErrMS: median(errs), P95ErrMS: percentile(errs, 95), MaxErrMS: errs[len(errs)-1],
	}, true
}

// measureRetry runs the section on cfg.RetryURL, or says why it cannot: a
// broker that does not answer or is older than 4.3 skips it with a note,
// not an error, since the rest of the bench does not need it.
func measureRetry(ctx context.Context, cfg Config) (*RetryResult, error) {
	res := &RetryResult{URL: redact(cfg.RetryURL), DelayMS: ms(retryDelay), Failures: retryFailures}
	conn, err := amqp.DialConfig(cfg.RetryURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		res.Skipped = fmt.Sprintf("no broker answers at %s (%v); start RabbitMQ 4.3 with scripts/rabbit4.sh 4.3 up, or point -retry-url at one", res.URL, err)
		return res, nil
	}
	b := &broker{url: cfg.RetryURL, conn: conn}
	defer b.Close()
	v := amqpconn.VersionOf(conn.Properties)
	res.Broker = v.Product + " " + v.String()
	if !v.AtLeast(4, 3) {
		res.Skipped = fmt.Sprintf("the broker at %s is %s, and a quorum queue's delayed retry needs RabbitMQ 4.3 or newer; "+
			"start one with scripts/rabbit4.sh 4.3 up, or point -retry-url at one", res.URL, res.Broker)
		return res, nil
	}
	e := &env{cfg: cfg, broker: b, brokerPID: brokerPID(cfg.RetryURL)}
	rb := &retryBench{waits: map[string][]time.Duration{}}
	variants := rb.variants(e)
	if slices.ContainsFunc(variants, func(v variant) bool { return !v.skip }) {
		if res.Flood, err = compare(ctx, e, sectionRetry, variants, cfg.RetryMessages); err != nil {
			return nil, err
		}
		for _, v := range res.Flood.Variants {
			if w, ok := waitAccuracy(v.Name, rb.waits[v.Name], retryDelay); ok {
				res.Waits = append(res.Waits, w)
			}
		}
		res.Goals = retryGoals(res.Flood)
	}
	if !cfg.Skip[partRetryMemory] {
		cfg.logf("retry: %d messages parked in a %v delay, delayed retry against a TTL tier", cfg.RetryParked, parkDelay)
		if res.Parked, err = measureParked(ctx, e); err != nil {
			return nil, fmt.Errorf("parked messages: %w", err)
		}
	}
	return res, nil
}

// retryVariantNames are the flood's variants and the memory part, by the
// names -skip takes.
func retryVariantNames() []string {
	var names []string
	for _, v := range (&retryBench{}).variants(&env{}) {
		names = append(names, v.name)
	}
	return append(names, partRetryMemory)
}

// retryBench holds what the flood's runs share: the timed waits, per variant.
type retryBench struct {
	mu    sync.Mutex
	waits map[string][]time.Duration
}

func (rb *retryBench) record(variant string, waits []time.Duration) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	rb.waits[variant] = append(rb.waits[variant], waits...)
}

// The flood's variants, raw first as the baseline: each declares its own
// quorum topology on the 4.3 broker, fills it and deletes it after.
func (rb *retryBench) variants(e *env) []variant {
	c, p := e.cfg.Consumers, e.cfg.Prefetch
	schedule := fmt.Sprintf("DelayedRedelivery{Redeliveries: %d, Min: %v, Max: %v}", retryLimit, retryDelay, retryDelay)
	vs := []variant{
		{name: "raw-delayed", run: rb.rawDelayed,
			about: fmt.Sprintf("amqp091-go on the work queue that dlx.Topology declares for %s (x-delayed-retry-type failed, min = max = %d ms, x-delivery-limit %d): "+
				"%d consumers with Qos(%d), basic.reject(requeue=true) on a failure, ack on success; the broker holds each rejected delivery %v",
				schedule, retryDelay.Milliseconds(), retryLimit, c, p, retryDelay)},
		{name: "delayed", run: rb.delayed,
			about: fmt.Sprintf("listener, Chain(Recover(topo.Redeliver(pub))) on dlx.Topology{Type: Quorum, DelayedRedelivery: &%s}, "+
				"WithConcurrentConsumers(%d), WithPrefetch(%d): each failure handed back with basic.reject(requeue=true) at once", schedule, c, p)},
		{name: "raw-tiers", run: rb.rawTiers,
			about: fmt.Sprintf("amqp091-go on the layout of topo.TierEquivalent() (a %v TTL tier queue, quorum, dead-lettering back to the work queue): "+
				"%d consumers with Qos(%d), each with a confirm channel: a failure publishes a bare persistent copy to the tier with a deferred confirm "+
				"and acks the original once it is confirmed", retryDelay, c, p)},
		{name: "tiers", run: rb.tiers,
			about: fmt.Sprintf("listener, Chain(Recover(topo.Tiers(pub, dlx.MaxRetries(%d)))) on topo.TierEquivalent(): each failure republished with "+
				"its fault headers and x-retry-count to the %v tier, confirmed, then acked", retryLimit, retryDelay)},
		{name: "local-retry", run: rb.localRetry,
			about: fmt.Sprintf("listener, Chain(Retry(%d, WithInitialInterval(%v), WithMultiplier(1), WithMaxInterval(%v))) on a quorum work queue, "+
				"no broker retry: each delivery waits out its failures in the client, holding its prefetch slot", retryFailures+1, retryDelay, retryDelay)},
	}
	for i := range vs {
		vs[i].ownQueue = true
		vs[i].skip = e.cfg.Skip[vs[i].name]
	}
	return vs
}

// floodTopology is the delayed-retry layout of the flood's work queue q.
func floodTopology(q string) dlx.Topology {
	return dlx.Topology{Queue: q, Type: dlx.Quorum,
		DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: retryLimit, Min: retryDelay, Max: retryDelay}}
}

// consumers is what a variant started: stop ends it and returns its error;
// failed, if not nil, reports a failure while it runs.
type consumers struct {
	stop   func() error
	failed <-chan error
}

// flood runs one variant once: it declares topo, fills the work queue with
// n messages whose ids are 0 to n-1, lets the broker settle, and measures
// start's consumers from the first delivery to the n-th success.
func (rb *retryBench) flood(ctx context.Context, e *env, name string, topo dlx.Topology, n int,
	start func(f *flaky, t *tally) (consumers, error)) (s Sample, err error) {
	cleanup, err := declareTopology(e.broker, topo)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	if err := e.broker.fillIDs(ctx, topo.Queue, n); err != nil {
		return Sample{}, err
	}
	if err := sleep(ctx, e.cfg.Settle); err != nil {
		return Sample{}, err
	}
	settleHeap()

	f := newFlaky(n, retryFailures, max(1, n/retryTimedMessages))
	t := newTally(n)
	cpu0 := e.cpuMark()
	c, err := start(f, t)
	if err != nil {
		return Sample{}, err
	}
	waited := make(chan error, 1)
	go func() { waited <- t.wait(ctx) }()
	select {
	case err = <-waited:
	case err = <-c.failed:
	}
	if err == nil {
		s = sampleOf(t, cpu0)
	}
	if err = errors.Join(err, c.stop()); err != nil {
		return Sample{}, err
	}
	if u := f.unknown.Load(); u > 0 {
		return Sample{}, fmt.Errorf("%d deliveries with a message id the flood did not publish", u)
	}
	rb.record(name, f.timedWaits())
	// Every message succeeded on its third attempt: none may have reached
	// the DLQ, or the run measured something else.
	if q, err := e.broker.inspect(topo.DLQ()); err != nil || q.Messages != 0 {
		return Sample{}, errors.Join(err, fmt.Errorf("the DLQ %s holds %d messages, want 0", topo.DLQ(), q.Messages))
	}
	return s, nil
}

// flakyHandler is the flood's handler for the library variants.
func flakyHandler(f *flaky, t *tally) middleware.Handler {
	return func(_ context.Context, d *amqp.Delivery) error {
		t.begin()
		if f.attempt(d.MessageId) {
			return errFlaky
		}
		t.hit()
		return nil
	}
}

func (rb *retryBench) rawDelayed(ctx context.Context, e *env, q string, n int) (Sample, error) {
	return rb.flood(ctx, e, "raw-delayed", floodTopology(q), n, func(f *flaky, t *tally) (consumers, error) {
		return startRaw(e, q, "raw-delayed-", func(rawConsumer) (func(amqp.Delivery) error, func(), error) {
			return func(d amqp.Delivery) error {
				t.begin()
				if f.attempt(d.MessageId) {
					return d.Reject(true)
				}
				if err := d.Ack(false); err != nil {
					return err
				}
				t.hit()
				return nil
			}, nil, nil
		})
	})
}

func (rb *retryBench) rawTiers(ctx context.Context, e *env, q string, n int) (Sample, error) {
	topo := floodTopology(q).TierEquivalent()
	tier := topo.RetryQueue(retryDelay)
	return rb.flood(ctx, e, "raw-tiers", topo, n, func(f *flaky, t *tally) (consumers, error) {
		return startRaw(e, q, "raw-tiers-", func(c rawConsumer) (func(amqp.Delivery) error, func(), error) {
			pubCh, err := c.conn.Channel()
			if err != nil {
				return nil, nil, err
			}
			if err := pubCh.Confirm(false); err != nil {
				return nil, nil, err
			}
			// The copies await their confirms in order on pending, and a
			// goroutine acks each original as its copy is confirmed. Every
			// original on pending is unacked, so there are at most a
			// prefetch of them: sending never blocks.
			pending := make(chan pendingCopy, e.cfg.Prefetch)
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				for p := range pending {
					if ok, err := p.confirm.WaitContext(ctx); !ok || err != nil {
						c.fail(fmt.Errorf("copy not confirmed: %v", err))
						for range pending { // until the consumer ends
						}
						return
					}
					_ = p.original.Ack(false)
				}
			}()
			handle := func(d amqp.Delivery) error {
				t.begin()
				if !f.attempt(d.MessageId) {
					if err := d.Ack(false); err != nil {
						return err
					}
					t.hit()
					return nil
				}
				dc, err := pubCh.PublishWithDeferredConfirmWithContext(ctx, "", tier, true, false,
					amqp.Publishing{MessageId: d.MessageId, Body: d.Body, DeliveryMode: amqp.Persistent})
				if err != nil {
					return err
				}
				pending <- pendingCopy{d, dc}
				return nil
			}
			return handle, func() { close(pending) }, nil
		})
	})
}

// report sends err without blocking: one failure is enough to tell.
func report(ch chan<- error, err error) {
	select {
	case ch <- err:
	default:
	}
}

// rawConsumer is what startRaw gives each consumer it sets up: the
// connection, a way to report a failure, and the group of goroutines that
// stop waits for (after closing the connection).
type rawConsumer struct {
	conn *amqp.Connection
	fail func(error)
	wg   *sync.WaitGroup
}

// startRaw consumes q on amqp091-go channels of its own, one consumer each
// with the configured prefetch. newConsumer makes each consumer's handler,
// and optionally a function called when its deliveries end; a handler's
// error stops its consumer and is reported on failed.
func startRaw(e *env, q, tagPrefix string, newConsumer func(rawConsumer) (handle func(amqp.Delivery) error, done func(), err error)) (consumers, error) {
	conn, err := amqp.Dial(e.broker.url)
	if err != nil {
		return consumers{}, err
	}
	var wg sync.WaitGroup
	failed := make(chan error, 1)
	rc := rawConsumer{conn: conn, fail: func(err error) { report(failed, err) }, wg: &wg}
	// Closing the connection ends the deliveries, which ends the goroutines.
	stop := func() error {
		err := conn.Close()
		wg.Wait()
		if errors.Is(err, amqp.ErrClosed) {
			err = nil
		}
		return err
	}
	for i := range e.cfg.Consumers {
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Qos(e.cfg.Prefetch, 0, false)
		}
		var handle func(amqp.Delivery) error
		var done func()
		if err == nil {
			handle, done, err = newConsumer(rc)
		}
		var deliveries <-chan amqp.Delivery
		if err == nil {
			deliveries, err = ch.Consume(q, fmt.Sprint(tagPrefix, i), false, false, false, false, nil)
		}
		if err != nil {
			if done != nil {
				done()
			}
			return consumers{}, errors.Join(err, stop())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if done != nil {
				defer done()
			}
			for d := range deliveries {
				if err := handle(d); err != nil {
					rc.fail(err)
					for range deliveries { // until the connection closes
					}
					return
				}
			}
		}()
	}
	return consumers{stop: stop, failed: failed}, nil
}

// runListener starts a listener on the 4.3 broker with a publisher for its
// recoverer; stop ends both.
func runListener(ctx context.Context, e *env, q string, mw func(pub *publisher.Publisher) middleware.Middleware, h middleware.Handler) (consumers, error) {
	pub, err := publisher.New(e.broker.url, publisher.WithLogger(quietLogger()))
	if err != nil {
		return consumers{}, err
	}
	stop, err := startListener(ctx, e, q, mw(pub), h, listener.WithLogger(retryLogger()))
	if err != nil {
		return consumers{}, errors.Join(err, pub.Close())
	}
	return consumers{stop: func() error { return errors.Join(stop(), pub.Close()) }}, nil
}

func (rb *retryBench) delayed(ctx context.Context, e *env, q string, n int) (Sample, error) {
	topo := floodTopology(q)
	return rb.flood(ctx, e, "delayed", topo, n, func(f *flaky, t *tally) (consumers, error) {
		return runListener(ctx, e, q, func(pub *publisher.Publisher) middleware.Middleware {
			return middleware.Chain(middleware.Recover(topo.Redeliver(pub)))
		}, flakyHandler(f, t))
	})
}

func (rb *retryBench) tiers(ctx context.Context, e *env, q string, n int) (Sample, error) {
	topo := floodTopology(q).TierEquivalent()
	return rb.flood(ctx, e, "tiers", topo, n, func(f *flaky, t *tally) (consumers, error) {
		return runListener(ctx, e, q, func(pub *publisher.Publisher) middleware.Middleware {
			return middleware.Chain(middleware.Recover(topo.Tiers(pub, dlx.MaxRetries(retryLimit))))
		}, flakyHandler(f, t))
	})
}

func (rb *retryBench) localRetry(ctx context.Context, e *env, q string, n int) (Sample, error) {
	return rb.flood(ctx, e, "local-retry", dlx.Topology{Queue: q, Type: dlx.Quorum}, n, func(f *flaky, t *tally) (consumers, error) {
		return runListener(ctx, e, q, func(*publisher.Publisher) middleware.Middleware {
			return middleware.Chain(middleware.Retry(retryFailures+1,
				middleware.WithInitialInterval(retryDelay), middleware.WithMultiplier(1), middleware.WithMaxInterval(retryDelay)),
				middleware.Recover(recoverer.Requeue())) // (every message succeeds within its retries)
		}, flakyHandler(f, t))
	})
}

// retryLogger is quietLogger without the listener's warning for each failed
// delivery: the flood fails every message twice on purpose, and 40,000
// lines a run on the terminal would measure the terminal. The listener
// still builds each record; only the writing is left out.
func retryLogger() *slog.Logger {
	return slog.New(dropMessage{
		Handler: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}),
		msg:     "listener: message failed",
	})
}

// dropMessage is a slog.Handler that leaves out the records with one message.
type dropMessage struct {
	slog.Handler
	msg string
}

func (h dropMessage) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h dropMessage) WithAttrs(attrs []slog.Attr) slog.Handler {
	return dropMessage{h.Handler.WithAttrs(attrs), h.msg}
}

func (h dropMessage) WithGroup(name string) slog.Handler {
	return dropMessage{h.Handler.WithGroup(name), h.msg}
}

// declareTopology declares topo on a channel of b's connection (which knows
// the broker's version, as DelayedRedelivery needs) and returns a function
// that deletes every queue and the exchange it declared.
func declareTopology(b *broker, topo dlx.Topology) (cleanup func() error, err error) {
	cleanup = func() error {
		names := []string{topo.Queue, topo.DLQ()}
		for _, d := range topo.RetryDelays {
			names = append(names, topo.RetryQueue(d))
		}
		var errs []error
		for _, q := range names {
			errs = append(errs, b.remove(q))
		}
		errs = append(errs, b.withChannel(func(ch *amqp.Channel) error { return ch.ExchangeDelete(topo.DLX(), false, false) }))
		return errors.Join(errs...)
	}
	if err := topo.DeclareOn(b.conn); err != nil {
		return nil, errors.Join(fmt.Errorf("declare %s: %w", topo.Queue, err), cleanup())
	}
	return cleanup, nil
}

// flaky decides, per message id, which attempts fail: the first failures
// of each message, then it succeeds. It also times, for every every-th id,
// the wait from each failing attempt to the next attempt. Ids are the
// decimal numbers 0 to n-1 that fillIDs gives. It is safe for many
// goroutines, and one message's attempts may come on any of them.
type flaky struct {
	failures int32
	every    int
	attempts []atomic.Int32
	failedAt []atomic.Int64 // when the last failing attempt began (since epoch); 0: none pending
	unknown  atomic.Int64   // attempts with an id outside 0 to n-1

	mu    sync.Mutex
	waits []time.Duration
}

func newFlaky(n, failures, every int) *flaky {
	return &flaky{failures: int32(failures), every: max(every, 1), attempts: make([]atomic.Int32, n), failedAt: make([]atomic.Int64, n)}
}

// attempt records an attempt at message id, which begins now, and reports
// whether it fails.
func (f *flaky) attempt(id string) (fails bool) {
	i, err := strconv.Atoi(id)
	if err != nil || i < 0 || i >= len(f.attempts) {
		f.unknown.Add(1)
		return false
	}
	timed := i%f.every == 0
	var now int64
	if timed {
		now = int64(time.Since(epoch))
		if failed := f.failedAt[i].Swap(0); failed != 0 {
			f.mu.Lock()
			f.waits = append(f.waits, time.Duration(now-failed))
			f.mu.Unlock()
		}
	}
	fails = f.attempts[i].Add(1) <= f.failures
	if fails && timed {
		f.failedAt[i].Store(max(now, 1))
	}
	return fails
}

// timedWaits are the waits measured so far.
func (f *flaky) timedWaits() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.waits)
}

// retryGoals are the section's targets: the library's delayed retry at
// least 0.9× a raw loop on the same queue, and at least twice the TTL
// tiers' msg/s.
func retryGoals(c *Comparison) []Goal {
	goals := []Goal{
		{Section: sectionRetry, Variant: "delayed", Measure: "msg/s", Against: "raw-delayed", Limit: 0.9},
		{Section: sectionRetry, Variant: "delayed", Measure: "msg/s", Against: "tiers", Limit: 2},
	}
	for i := range goals {
		goals[i] = goals[i].evaluate(c)
	}
	return goals
}
