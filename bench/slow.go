package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The slow-handlers section: messages whose handler takes 20 ms, where what
// bounds the drain is how many handlers run at once, not the client's CPU.
// With 8 at a time, n messages cannot drain faster than n·20ms/8.
const (
	slowHandler = 20 * time.Millisecond
	slowFrom    = 4
	slowTo      = 8
	// slowRawPrefetch is the raw anchor's Qos: three deliveries per
	// goroutine, what the listener's default prefetch gives each of its
	// channels for 8 handlers.
	slowRawPrefetch = 3 * slowTo
	// slowReadyWait bounds the wait for the burst's listener to consume.
	slowReadyWait = 30 * time.Second
)

// The section's variants, run in interleaved rounds as compare runs the
// throughput's.
const (
	slowBacklogListener = "backlog-listener"
	slowBacklogRaw      = "backlog-raw"
	slowBurstListener   = "burst-listener"
)

// The section's goals: the listener within a tenth of the raw anchor on a
// backlog, and within a fifth (backlog) or under a third (burst) of the
// ideal drain, all 8 handlers busy within half a second of a burst's first
// delivery.
const (
	slowGoalVsRaw        = 0.9
	slowGoalBacklogIdeal = 1.2
	slowGoalBurstIdeal   = 1.3
	slowGoalBurstToMax   = 500 * time.Millisecond
)

// SlowResult is the slow-handlers section: every round's samples of each
// variant, their medians and the goals.
type SlowResult struct {
	Messages    int     `json:"messages_per_run"`
	HandlerMS   float64 `json:"handler_ms"`
	From        int     `json:"from_handlers"`
	To          int     `json:"to_handlers"`
	RawPrefetch int     `json:"raw_prefetch"`
	// IdealSeconds is Messages·HandlerMS/To: the drain with To handlers
	// busy from the first message to the last and nothing else costing
	// time.
	IdealSeconds float64       `json:"ideal_seconds"`
	Rounds       int           `json:"rounds"`
	Order        [][]string    `json:"order_per_round"`
	Variants     []SlowVariant `json:"variants"`
	Goals        []LimitGoal   `json:"goals"`
}

// SlowVariant is one variant's samples, in round order, and their medians.
type SlowVariant struct {
	Name    string       `json:"name"`
	About   string       `json:"about"`
	Samples []SlowSample `json:"samples"`
	// DrainFrom says where the drain is timed from: "run" (Run, or the raw
	// anchor's dial, to the last handler's return) or "first delivery".
	DrainFrom         string  `json:"drain_from"`
	MedianDrain       float64 `json:"median_drain_seconds"`
	MedianMsgPerSec   float64 `json:"median_msg_per_sec"`
	MedianPeak        float64 `json:"median_peak_handlers"`
	MedianToMax       float64 `json:"median_seconds_to_max"` // -1: in most rounds To never ran at once
	DrainToIdeal      float64 `json:"drain_to_ideal"`
	MedianPublishSecs float64 `json:"median_publish_seconds,omitempty"`
}

// SlowSample is one run of one variant.
type SlowSample struct {
	// FromStart is Run (raw: its dial) to the last handler's return;
	// FromFirst the first handler's start to the last one's return.
	FromStart float64 `json:"seconds_from_start"`
	FromFirst float64 `json:"seconds_from_first_delivery"`
	// Drain is the one of the two the variant is measured on, and
	// MsgPerSec the messages over it.
	Drain     float64 `json:"drain_seconds"`
	MsgPerSec float64 `json:"msg_per_sec"`
	Peak      int     `json:"peak_handlers"`
	// ToMax is the first handler's start to To handlers running at once;
	// -1 if they never did.
	ToMax float64 `json:"seconds_to_max"`
	// BrokerConsumers is the queue's consumer count once drained: the
	// listener's channels (or the raw anchor's one).
	BrokerConsumers int `json:"broker_consumers"`
	// PublishSeconds is how long the burst's publishes took, confirms
	// included; 0 for a backlog.
	PublishSeconds float64 `json:"publish_seconds,omitempty"`
	// Steps is each rise of the most handlers at once, from the first
	// delivery: how the pool grew.
	Steps []HandlerStep `json:"handler_steps"`
}

// HandlerStep is the moment, from the first delivery, the most handlers
// running at once rose to Handlers.
type HandlerStep struct {
	Seconds  float64 `json:"seconds_from_first_delivery"`
	Handlers int     `json:"handlers"`
}

// slowVariant is one way the section drains its messages.
type slowVariant struct {
	name, about string
	fromFirst   bool // the drain is timed from the first delivery, not from the start
	run         func(ctx context.Context, e *env, q string, n int) (SlowSample, error)
}

func slowVariants() []slowVariant {
	return []slowVariant{
		{name: slowBacklogListener, run: slowListenerBacklog,
			about: fmt.Sprintf("the queue filled first, then a listener with WithConcurrentConsumers(%d), WithMaxConcurrentConsumers(%d), the default prefetch "+
				"and Chain(Retry(5), Recover(Republish)); drain timed from Run", slowFrom, slowTo)},
		{name: slowBacklogRaw, run: slowRawBacklog,
			about: fmt.Sprintf("amqp091-go as a careful user writes it: one channel, Qos(%d), %d goroutines ranging over its deliveries, "+
				"each handling then acking (d.Ack(false)); the same backlog, drain timed from the dial", slowRawPrefetch, slowTo)},
		{name: slowBurstListener, run: slowListenerBurst, fromFirst: true,
			about: "the same listener started on an empty queue; once Stats().Ready, the messages published at once on one channel " +
				"with confirms, as the bench fills its queues; drain timed from the first delivery"},
	}
}

// measureSlow runs the variants in interleaved rounds, each starting one
// variant further along, and takes medians.
func measureSlow(ctx context.Context, e *env) (*SlowResult, error) {
	n := e.cfg.SlowMessages
	res := &SlowResult{
		Messages: n, HandlerMS: ms(slowHandler), From: slowFrom, To: slowTo, RawPrefetch: slowRawPrefetch,
		IdealSeconds: idealDrain(n).Seconds(), Rounds: e.cfg.Rounds,
	}
	variants := slowVariants()
	res.Variants = make([]SlowVariant, len(variants))
	all := make([]int, len(variants))
	for i, v := range variants {
		all[i] = i
		res.Variants[i] = SlowVariant{Name: v.name, About: v.about, DrainFrom: "run"}
		if v.fromFirst {
			res.Variants[i].DrainFrom = "first delivery"
		}
	}
	for round := 1; round <= e.cfg.Rounds; round++ {
		var names []string
		order := roundOrder(all, round)
		for _, i := range order {
			names = append(names, variants[i].name)
		}
		res.Order = append(res.Order, names)
		for _, i := range order {
			v := variants[i]
			s, err := v.run(ctx, e, uniqueName(sectionSlow+"."+v.name), n)
			if err != nil {
				return nil, fmt.Errorf("%s, round %d: %w", v.name, round, err)
			}
			e.cfg.logf("slow round %d/%d %-16s drain %5.2fs  %6.0f msg/s  peak %d handlers  to %d: %s",
				round, e.cfg.Rounds, v.name, s.Drain, s.MsgPerSec, s.Peak, slowTo, secondsText(s.ToMax))
			res.Variants[i].Samples = append(res.Variants[i].Samples, s)
		}
	}
	res.summarize()
	return res, nil
}

// idealDrain is n messages' drain with slowTo handlers always busy.
func idealDrain(n int) time.Duration { return time.Duration(n) * slowHandler / slowTo }

// summarize fills in the medians and the goals.
func (r *SlowResult) summarize() {
	for i := range r.Variants {
		v := &r.Variants[i]
		var drains, rates, peaks, toMax, publish []float64
		for _, s := range v.Samples {
			drains, rates, peaks = append(drains, s.Drain), append(rates, s.MsgPerSec), append(peaks, float64(s.Peak))
			toMax, publish = append(toMax, s.ToMax), append(publish, s.PublishSeconds)
		}
		v.MedianDrain, v.MedianMsgPerSec, v.MedianPeak = median(drains), median(rates), median(peaks)
		v.MedianToMax, v.MedianPublishSecs = medianOrNever(toMax), median(publish)
		v.DrainToIdeal = ratio(v.MedianDrain, r.IdealSeconds)
	}
	backlog, raw, burst := r.variant(slowBacklogListener), r.variant(slowBacklogRaw), r.variant(slowBurstListener)
	r.Goals = nil
	if backlog != nil && raw != nil {
		r.Goals = append(r.Goals, newLimitGoal("backlog: listener msg/s ÷ raw msg/s", false, slowGoalVsRaw, "×",
			ratio(backlog.MedianMsgPerSec, raw.MedianMsgPerSec)))
	}
	if backlog != nil {
		r.Goals = append(r.Goals, newLimitGoal("backlog: listener drain from Run ÷ ideal", true, slowGoalBacklogIdeal, "×", backlog.DrainToIdeal))
	}
	if burst != nil {
		r.Goals = append(r.Goals,
			newLimitGoal(fmt.Sprintf("burst: first delivery → %d handlers at once", slowTo), true, slowGoalBurstToMax.Seconds(), "s", burst.MedianToMax),
			newLimitGoal("burst: listener drain from the first delivery ÷ ideal", true, slowGoalBurstIdeal, "×", burst.DrainToIdeal))
	}
}

// variant returns the named variant's result, or nil if it did not run.
func (r *SlowResult) variant(name string) *SlowVariant {
	for i := range r.Variants {
		if r.Variants[i].Name == name && len(r.Variants[i].Samples) > 0 {
			return &r.Variants[i]
		}
	}
	return nil
}

// medianOrNever is the median of times where -1 means never: never counts
// as longer than any time, and a median that is never is -1.
func medianOrNever(xs []float64) float64 {
	ys := make([]float64, len(xs))
	for i, x := range xs {
		ys[i] = x
		if x < 0 {
			ys[i] = math.Inf(1)
		}
	}
	if m := median(ys); !math.IsInf(m, 1) {
		return m
	}
	return -1
}

// secondsText is a time in seconds, or "never" for -1.
func secondsText(s float64) string {
	if s < 0 {
		return "never"
	}
	return fmt.Sprintf("%.3fs", s)
}

// slowRun is what one run's handlers count: messages finished and
// handlers running at once.
type slowRun struct {
	t *tally
	g *gauge
}

func newSlowRun(n int) *slowRun { return &slowRun{t: newTally(n), g: newGauge(slowTo)} }

// handle is the 20 ms job, counted: in the listener it is the handler, in
// the raw anchor what each goroutine does before its ack.
func (r *slowRun) handle(ctx context.Context) {
	r.t.begin()
	r.g.enter()
	work(ctx, slowHandler)
	r.g.leave()
	r.t.hit()
}

// sample turns a finished run into a sample; started is when Run (or the
// raw anchor's dial) began, since epoch.
func (r *slowRun) sample(started time.Duration, fromFirst bool) SlowSample {
	first, last := time.Duration(r.t.first.Load()), time.Duration(r.t.last.Load())
	s := SlowSample{FromStart: (last - started).Seconds(), FromFirst: (last - first).Seconds(), Peak: r.g.highest(), ToMax: -1}
	s.Drain = s.FromStart
	if fromFirst {
		s.Drain = s.FromFirst
	}
	s.MsgPerSec = float64(r.t.target) / s.Drain
	if at, ok := r.g.reachedAt(); ok {
		s.ToMax = (at - first).Seconds()
	}
	for _, st := range r.g.timeline() {
		s.Steps = append(s.Steps, HandlerStep{Seconds: (st.At - first).Seconds(), Handlers: st.Handlers})
	}
	return s
}

// newSlowListener is the listener of the listener variants: 4 to 8
// handlers at a time, the default prefetch (not the bench's -prefetch:
// the default is what the section is about), and the usual chain.
func newSlowListener(e *env, q string, r middleware.Recoverer, run *slowRun) (*listener.Listener, error) {
	mw := middleware.Chain(middleware.Retry(5), middleware.Recover(r))
	handle := func(ctx context.Context, _ *amqp.Delivery) error {
		run.handle(ctx)
		return nil
	}
	return listener.New(q, mw, handle,
		listener.WithURL(e.broker.url),
		listener.WithLogger(quietLogger()),
		listener.WithConcurrentConsumers(slowFrom),
		listener.WithMaxConcurrentConsumers(slowTo))
}

// slowListenerBacklog fills the queue, then starts the listener and times
// the drain from Run.
func slowListenerBacklog(ctx context.Context, e *env, q string, n int) (s SlowSample, err error) {
	dlq := q + ".dlq"
	pub, done, err := e.withRecovery(q, dlq)
	if err != nil {
		return SlowSample{}, err
	}
	defer func() { err = errors.Join(err, done()) }()
	if err := fillAndSettle(ctx, e, q, n); err != nil {
		return SlowSample{}, err
	}
	run := newSlowRun(n)
	l, err := newSlowListener(e, q, recoverer.Republish(pub, "", dlq), run)
	if err != nil {
		return SlowSample{}, err
	}
	started := time.Since(epoch)
	stop := goRun(ctx, l)
	defer func() { err = errors.Join(err, stop()) }()
	if err := run.t.wait(ctx); err != nil {
		return SlowSample{}, err
	}
	s = run.sample(started, false)
	return s, finishListener(e, q, l, &s)
}

// slowListenerBurst starts the listener on an empty queue and, once it
// consumes, publishes the messages as fast as one confirming channel can.
func slowListenerBurst(ctx context.Context, e *env, q string, n int) (s SlowSample, err error) {
	dlq := q + ".dlq"
	pub, done, err := e.withRecovery(q, dlq)
	if err != nil {
		return SlowSample{}, err
	}
	defer func() { err = errors.Join(err, done()) }()
	run := newSlowRun(n)
	l, err := newSlowListener(e, q, recoverer.Republish(pub, "", dlq), run)
	if err != nil {
		return SlowSample{}, err
	}
	settleHeap()
	started := time.Since(epoch)
	stop := goRun(ctx, l)
	defer func() { err = errors.Join(err, stop()) }()
	readyCtx, cancel := context.WithTimeout(ctx, slowReadyWait)
	err = l.WaitReady(readyCtx)
	cancel()
	if err != nil {
		return SlowSample{}, fmt.Errorf("the listener did not consume within %v: %w", slowReadyWait, err)
	}
	published := time.Now()
	if err := e.broker.fill(ctx, q, n); err != nil {
		return SlowSample{}, err
	}
	publishSecs := time.Since(published).Seconds()
	if err := run.t.wait(ctx); err != nil {
		return SlowSample{}, err
	}
	s = run.sample(started, true)
	s.PublishSeconds = publishSecs
	return s, finishListener(e, q, l, &s)
}

// finishListener notes the broker's consumer count (the listener's channels)
// and fails the run if any message failed: a failure would be retried and
// time something else.
func finishListener(e *env, q string, l *listener.Listener, s *SlowSample) error {
	if st := l.Stats(); st.Failed > 0 {
		return fmt.Errorf("%d messages failed (%d recovered)", st.Failed, st.Recovered)
	}
	info, err := e.broker.inspect(q)
	if err != nil {
		return fmt.Errorf("inspect %s: %w", q, err)
	}
	s.BrokerConsumers = info.Consumers
	return nil
}

// slowRawBacklog is the anchor: what a careful Go user writes with
// amqp091-go for 8 slow jobs at a time. One channel whose prefetch keeps
// every goroutine fed, 8 goroutines taking deliveries from it as they
// free up, each acking its own.
func slowRawBacklog(ctx context.Context, e *env, q string, n int) (s SlowSample, err error) {
	cleanup, err := e.broker.queues(q)
	if err != nil {
		return SlowSample{}, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	if err := fillAndSettle(ctx, e, q, n); err != nil {
		return SlowSample{}, err
	}
	run := newSlowRun(n)
	started := time.Since(epoch)
	conn, err := amqp.Dial(e.broker.url)
	if err != nil {
		return SlowSample{}, err
	}
	// Cancelling ends the jobs in hand; closing the connection ends the
	// deliveries, and with them the goroutines.
	jobCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		_ = conn.Close()
		wg.Wait()
	}()
	ch, err := conn.Channel()
	if err != nil {
		return SlowSample{}, err
	}
	if err := ch.Qos(slowRawPrefetch, 0, false); err != nil {
		return SlowSample{}, err
	}
	deliveries, err := ch.Consume(q, "slow-raw", false, false, false, false, nil)
	if err != nil {
		return SlowSample{}, err
	}
	for range slowTo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range deliveries {
				run.handle(jobCtx)
				_ = d.Ack(false)
			}
		}()
	}
	if err := run.t.wait(ctx); err != nil {
		return SlowSample{}, err
	}
	s = run.sample(started, false)
	info, err := e.broker.inspect(q)
	if err != nil {
		return SlowSample{}, fmt.Errorf("inspect %s: %w", q, err)
	}
	s.BrokerConsumers = info.Consumers
	return s, nil
}

// stepsText is a pool's growth in a line, the rises in the same
// millisecond together: "1 at 0.000s, 2–8 at 0.262s".
func stepsText(steps []HandlerStep) string {
	var parts []string
	for i := 0; i < len(steps); {
		j := i
		for j+1 < len(steps) && math.Round(steps[j+1].Seconds*1000) == math.Round(steps[i].Seconds*1000) {
			j++
		}
		count := fmt.Sprint(steps[j].Handlers)
		if j > i {
			count = fmt.Sprintf("%d–%d", steps[i].Handlers, steps[j].Handlers)
		}
		parts = append(parts, fmt.Sprintf("%s at %.3fs", count, steps[i].Seconds))
		i = j + 1
	}
	if len(parts) == 0 {
		return "no handler ran"
	}
	return strings.Join(parts, ", ")
}

// fillAndSettle fills q with n messages and lets the broker settle, as
// runOnce does before the throughput's runs.
func fillAndSettle(ctx context.Context, e *env, q string, n int) error {
	if err := e.broker.fill(ctx, q, n); err != nil {
		return err
	}
	if err := sleep(ctx, e.cfg.Settle); err != nil {
		return err
	}
	settleHeap()
	return nil
}

// writeSlow prints the section: the table, how each drain is timed, and the
// goals.
func writeSlow(w io.Writer, r *SlowResult) {
	fmt.Fprintf(w, "## Slow handlers: %d messages, %.0f ms handler, %d → %d handlers at a time, default prefetch "+
		"(median of %d rounds, each starting one variant further along)\n\n", r.Messages, r.HandlerMS, r.From, r.To, r.Rounds)
	fmt.Fprintf(w, "Ideal drain: %d × %.0f ms ÷ %d = %.2f s, %.0f msg/s: %d handlers busy from the first message to the last.\n\n",
		r.Messages, r.HandlerMS, r.To, r.IdealSeconds, float64(r.Messages)/r.IdealSeconds, r.To)
	fmt.Fprintf(w, "| variant | drain timed from | drain s (median) | drain vs ideal | msg/s (median) | peak handlers (median) | first delivery → %d at once (median) | broker consumers | samples drain s |\n", r.To)
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---|")
	for _, v := range r.Variants {
		var samples []string
		for _, s := range v.Samples {
			samples = append(samples, fmt.Sprintf("%.2f", s.Drain))
		}
		consumers := "–"
		if len(v.Samples) > 0 {
			consumers = fmt.Sprint(v.Samples[len(v.Samples)-1].BrokerConsumers)
		}
		fmt.Fprintf(w, "| %s | %s | %.2f | %.2f | %.0f | %.0f | %s | %s | %s |\n", v.Name, v.DrainFrom, v.MedianDrain, v.DrainToIdeal,
			v.MedianMsgPerSec, v.MedianPeak, secondsText(v.MedianToMax), consumers, strings.Join(samples, ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "A drain ends when the last handler returns. Handlers at a time are counted in the handler (entered at its start, left at its end); "+
		"broker consumers is the queue's consumer count once drained, the listener's channels (the last round's).")
	if b := r.variant(slowBurstListener); b != nil {
		fmt.Fprintf(w, " The burst's publishes took %.2f s (median), confirms included.", b.MedianPublishSecs)
	}
	fmt.Fprint(w, "\n\n")
	fmt.Fprintln(w, "How the most handlers at once rose, from the first delivery, in the last round:")
	fmt.Fprintln(w)
	for _, v := range r.Variants {
		if len(v.Samples) > 0 {
			fmt.Fprintf(w, "- %s: %s\n", v.Name, stepsText(v.Samples[len(v.Samples)-1].Steps))
		}
	}
	fmt.Fprintln(w)
	writeOrder(w, r.Order)
	for _, v := range r.Variants {
		fmt.Fprintf(w, "- **%s**: %s\n", v.Name, v.About)
	}
	fmt.Fprintln(w)
	writeLimitGoals(w, "the slow handlers", r.Goals)
}
