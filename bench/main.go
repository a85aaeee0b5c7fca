// Command bench measures amqpretry against raw amqp091-go and Watermill on a
// live RabbitMQ broker: happy-path throughput, ack coalescing (on -url's broker
// and -retry-url's), a poison flood to the DLQ, the
// retry schedule's accuracy, the listener's scale-up time, slow handlers
// (a backlog and a burst, against a raw amqp091-go anchor), the chain's
// per-message overhead, the outbox relay against raw confirmed
// publishing with its commit-to-publish latency (on PostgreSQL, $DATABASE_URL),
// a batch handler writing a batch with one multi-row INSERT against a handler
// writing each message with its own and a raw amqp091-go loop doing the
// batched INSERTs (PostgreSQL too),
// and, on a RabbitMQ 4.3 broker (-retry-url), a flood of messages that each
// fail twice through the broker's delayed retry, TTL tiers and local
// retries, with the memory of messages parked in a delay. It prints a markdown report and writes
// results.json (every sample) and throughput.png into -out.
//
//	make bench                           # the broker, then the defaults below
//	go run . -rounds 1 -messages 5000 -skip schedule,watermill
//	go run . -out /tmp/outbox -skip throughput,coalesce,poison,schedule,scale,slow,chain,retry,batch   # the outbox alone
//	go run . -out /tmp/retry -skip throughput,coalesce,poison,schedule,scale,slow,chain,outbox,batch   # the retry section alone
//	go run . -out /tmp/batch -skip throughput,coalesce,poison,schedule,scale,slow,chain,outbox,retry   # the batch section alone
//	go run . -out /tmp/coalesce -skip throughput,poison,schedule,scale,slow,chain,outbox,retry,batch   # ack coalescing alone
//
// Throughput and poison-flood runs are interleaved, each round starting one
// variant further along (raw, listener, listener-otel, otel-floor, watermill;
// then listener, listener-otel, otel-floor, watermill, raw; ...), so that
// with the default five rounds each throughput variant runs first once, and
// reported as medians: the broker shares the machine, and a run's speed
// moves with whatever else the host is doing. results.json has every sample
// and the order each round ran in.
//
// With -profile DIR, every throughput and poison-flood run writes
// DIR/<section>-<variant>-r<round>.cpu.pprof, a CPU profile of exactly the
// measured run (not the queue's fill), and .allocs.pprof, the allocations
// made during it (this run's alone, not the process's since it began; the
// CPU profiler's own, runtime/pprof and compress/flate, among them).
// Profiling costs time, so the report says when it was on. To see a
// variant over all its rounds, merge them:
//
//	make bench PROFILE=1    # -profile results/profiles
//	go tool pprof -proto results/profiles/throughput-listener-r*.cpu.pprof > listener.cpu.pprof
//	go tool pprof -top listener.cpu.pprof
//	go tool pprof -top -sample_index=alloc_space results/profiles/throughput-listener-r*.allocs.pprof
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"syscall"
	"time"
)

func main() {
	cfg := defaultConfig()
	if u := os.Getenv("AMQP_URL"); u != "" {
		cfg.URL = u
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		cfg.DSN = u
	}
	cfg.Stdout, cfg.Log = os.Stdout, os.Stderr
	flag.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "interleaved rounds per comparison, each starting one variant further along; medians are reported")
	flag.IntVar(&cfg.Messages, "messages", cfg.Messages, "messages per happy-path run")
	flag.IntVar(&cfg.PoisonMessages, "poison-messages", cfg.PoisonMessages, "messages per poison-flood run (0: as -messages)")
	flag.IntVar(&cfg.ScaleBacklog, "scale-backlog", cfg.ScaleBacklog, "ready messages when the scale-up test starts")
	flag.IntVar(&cfg.SlowMessages, "slow-messages", cfg.SlowMessages, "messages per slow-handlers run (20 ms each)")
	flag.DurationVar(&cfg.Settle, "settle", cfg.Settle, "pause after filling a queue, before measuring")
	flag.IntVar(&cfg.OutboxMessages, "outbox-messages", cfg.OutboxMessages, "rows per outbox throughput run (relay and raw publish as many)")
	flag.IntVar(&cfg.OutboxBody, "outbox-body", cfg.OutboxBody, "bytes of each outbox message's body (relay and raw alike)")
	flag.IntVar(&cfg.OutboxLatencyMessages, "outbox-latency-messages", cfg.OutboxLatencyMessages, "orders committed one by one for the commit-to-publish latency")
	flag.IntVar(&cfg.BatchMessages, "batch-messages", cfg.BatchMessages, "messages per batch-section run (one INSERT per batch of 100; the per-message variant, one INSERT each, runs on a fifth of them)")
	flag.StringVar(&cfg.RetryURL, "retry-url", cfg.RetryURL, "the RabbitMQ 4.3 broker of the retry section (skipped, with a note, if it does not answer or is older) and the second broker of the coalescing section")
	flag.StringVar(&cfg.RetryCtl, "retry-ctl", cfg.RetryCtl, "the rabbitmqctl command that reaches -retry-url's node, for its queues' memory (empty: none)")
	flag.IntVar(&cfg.RetryMessages, "retry-messages", cfg.RetryMessages, "messages per retry-flood run (each fails twice, then succeeds)")
	flag.IntVar(&cfg.RetryParked, "retry-parked", cfg.RetryParked, "messages parked in a long delay for the retry section's memory measurement")
	flag.StringVar(&cfg.Out, "out", cfg.Out, "directory for results.json and throughput.png")
	flag.StringVar(&cfg.Profile, "profile", "", "directory for a CPU and an allocation profile of every throughput and poison-flood run (slows them)")
	skip := flag.String("skip", "", "comma list of sections ("+fmt.Sprint(sections)+") and variants ("+fmt.Sprint(append(append(append(variantNames(), coalesceVariantNames()...), retryVariantNames()...), batchVariantNames()...))+") to leave out")
	flag.Parse()
	var err error
	if cfg.Skip, err = parseSkip(*skip); err == nil {
		err = cfg.validate()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

// run measures every section not skipped, then writes the report and the
// files. On any failure it writes nothing, so a good earlier result is never
// replaced by a partial one.
func run(ctx context.Context, cfg Config) (*Results, error) {
	began := time.Now()
	if cfg.Profile != "" && runtime.MemProfileRate > profileMemRate {
		runtime.MemProfileRate = profileMemRate
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	b, err := dialBroker(cfg.URL)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	e := &env{cfg: cfg, broker: b, brokerPID: brokerPID(cfg.URL)}

	r := &Results{
		Machine: machineInfo(b),
		Settings: Settings{
			Rounds: cfg.Rounds, Messages: cfg.Messages, PoisonMessages: cfg.poisonMessages(),
			Consumers: cfg.Consumers, Prefetch: cfg.Prefetch, SettleSeconds: cfg.Settle.Seconds(),
			Profile: cfg.Profile,
		},
	}
	r.Machine.Date = began.UTC().Format(time.RFC3339)
	for name := range cfg.Skip {
		r.Settings.Skipped = append(r.Settings.Skipped, name)
	}
	sort.Strings(r.Settings.Skipped)

	// The micro-benchmark first, while nothing else runs; the retry schedule
	// last and alone, since load on the two shared cores would show up in
	// its timings.
	if !cfg.Skip[sectionChain] {
		cfg.logf("chain overhead (testing.Benchmark)")
		r.Chain = measureChain()
	}
	if !cfg.Skip[sectionThroughput] {
		if r.Throughput, err = compare(ctx, e, sectionThroughput, throughputVariants(e), cfg.Messages); err != nil {
			return nil, err
		}
	}
	if !cfg.Skip[sectionCoalesce] {
		if r.Coalesce, err = measureCoalesce(ctx, cfg); err != nil {
			return nil, fmt.Errorf("coalesce: %w", err)
		}
	}
	if !cfg.Skip[sectionPoison] {
		if r.Poison, err = compare(ctx, e, sectionPoison, poisonVariants(e), cfg.poisonMessages()); err != nil {
			return nil, err
		}
	}
	if !cfg.Skip[sectionScale] {
		cfg.logf("scale-up: %d → %d handlers at a time", scaleFrom, scaleTo)
		if r.ScaleUp, err = measureScaleUp(ctx, e); err != nil {
			return nil, fmt.Errorf("scale-up: %w", err)
		}
	}
	if !cfg.Skip[sectionSlow] {
		cfg.logf("slow handlers: %d messages, %v each, %d → %d handlers at a time, against raw amqp091-go", cfg.SlowMessages, slowHandler, slowFrom, slowTo)
		if r.Slow, err = measureSlow(ctx, e); err != nil {
			return nil, fmt.Errorf("slow handlers: %w", err)
		}
	}
	if !cfg.Skip[sectionOutbox] {
		cfg.logf("outbox: relay against raw confirmed publishing, %d messages", cfg.OutboxMessages)
		if r.Outbox, err = measureOutbox(ctx, e); err != nil {
			return nil, fmt.Errorf("outbox: %w", err)
		}
	}
	if !cfg.Skip[sectionBatch] {
		cfg.logf("batch: one INSERT per message against one per batch of %d, %d messages", benchBatchSize, cfg.BatchMessages)
		if r.Batch, err = measureBatch(ctx, e); err != nil {
			return nil, fmt.Errorf("batch: %w", err)
		}
	}
	if !cfg.Skip[sectionRetry] {
		cfg.logf("retry flood on %s: %d messages, each failing %d times, %v waits", redact(cfg.RetryURL), cfg.RetryMessages, retryFailures, retryDelay)
		if r.Retry, err = measureRetry(ctx, cfg); err != nil {
			return nil, fmt.Errorf("retry: %w", err)
		}
		if r.Retry.Skipped != "" {
			cfg.logf("retry: skipped: %s", r.Retry.Skipped)
		}
	}
	if !cfg.Skip[sectionSchedule] {
		cfg.logf("retry schedule: one message through Retry(%d), about 15s", scheduleAttempts)
		if r.Schedule, err = measureSchedule(ctx, e); err != nil {
			return nil, fmt.Errorf("retry schedule: %w", err)
		}
	}
	r.Goals = issueGoals(r)
	r.WallSecs = time.Since(began).Seconds()
	r.Machine.LoadAfter = loadAverage()

	if err := writeJSON(cfg.Out, r); err != nil {
		return nil, err
	}
	if r.Throughput != nil {
		subtitle := fmt.Sprintf("%d consumers, prefetch %d, %d messages, %s %s, %s",
			cfg.Consumers, cfg.Prefetch, cfg.Messages, r.Machine.Broker, r.Machine.BrokerVer, r.Machine.Date[:10])
		if cfg.Profile != "" {
			subtitle += ", profiled (slower)"
		}
		if err := writeChart(cfg.Out, r.Throughput, subtitle); err != nil {
			return nil, fmt.Errorf("throughput.png: %w", err)
		}
	}
	if cfg.Stdout != nil {
		writeMarkdown(cfg.Stdout, r)
	}
	return r, nil
}
