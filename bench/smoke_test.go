package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// requireBroker skips without a broker, or fails under
// AMQPRETRY_REQUIRE_BROKER=1 (make test): there a skipped smoke test would
// hide a bench that no longer runs.
func requireBroker(t *testing.T) string {
	t.Helper()
	url := defaultURL
	if u := os.Getenv("AMQP_URL"); u != "" {
		url = u
	}
	b, err := dialBroker(url)
	if err != nil {
		if os.Getenv("AMQPRETRY_REQUIRE_BROKER") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	_ = b.Close()
	return url
}

// requireDB returns the PostgreSQL DSN of the outbox section, or "" (and the
// section is skipped) without one; under AMQPRETRY_REQUIRE_DB=1 (make test)
// a missing database fails the test instead.
func requireDB(t *testing.T) string {
	t.Helper()
	dsn := defaultDSN
	if u := os.Getenv("DATABASE_URL"); u != "" {
		dsn = u
	}
	db, err := sql.Open("pgx", dsn)
	if err == nil {
		err = db.Ping()
		_ = db.Close()
	}
	if err != nil {
		if os.Getenv("AMQPRETRY_REQUIRE_DB") == "1" {
			t.Fatalf("no PostgreSQL for the outbox section: %v", err)
		}
		t.Logf("no PostgreSQL, so no outbox section: %v", err)
		return ""
	}
	return dsn
}

// TestSmoke runs the whole program end to end with tiny numbers, two
// rounds and profiles, leaving out only the 15-second retry schedule.
func TestSmoke(t *testing.T) {
	cfg := defaultConfig()
	cfg.URL = requireBroker(t)
	const rounds = 2
	cfg.Rounds, cfg.Messages, cfg.PoisonMessages = rounds, 300, 200
	cfg.Settle = 0
	cfg.Out = t.TempDir()
	cfg.Profile = filepath.Join(cfg.Out, "profiles")
	cfg.Skip = map[string]bool{sectionSchedule: true}
	cfg.OutboxMessages, cfg.OutboxLatencyMessages = 300, 20
	cfg.BatchMessages = 300
	cfg.SlowMessages = 200 // 0.5 s a run at 8 handlers at a time
	cfg.RetryMessages, cfg.RetryParked = 200, 300
	// Without rabbitmqctl the parked messages are counted by passive
	// declares, at once, instead of waiting seconds for the broker's
	// statistics; TestRabbitmqctlListsQueueMemory covers rabbitmqctl.
	cfg.RetryCtl = ""
	// The retry section, and coalescing's second broker, on the suite's
	// broker: make test runs each broker's suite in a lane of its own,
	// beside the 4.3 one, which restarts its broker. The retry section runs
	// in the 4.3 suite and says why it is skipped in the others.
	cfg.RetryURL = cfg.URL
	if cfg.DSN = requireDB(t); cfg.DSN == "" {
		cfg.Skip[sectionOutbox] = true
		cfg.Skip[sectionBatch] = true
	}
	var out bytes.Buffer
	cfg.Stdout = &out

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []*Comparison{res.Throughput, res.Poison} {
		for _, v := range c.Variants {
			if len(v.Samples) != rounds || v.MedianMsgPerSec <= 0 || v.MedianCPUPerMsg <= 0 || v.CPURatioToBaseline <= 0 {
				t.Errorf("%s: %+v", v.Name, v)
			}
		}
		// Each round starts one variant further along, and runs them all.
		if len(c.Order) != rounds || len(c.Order[0]) != len(c.Variants) ||
			c.Order[0][0] != c.Variants[0].Name || c.Order[1][0] != c.Variants[1].Name || c.Order[1][len(c.Variants)-1] != c.Variants[0].Name {
			t.Errorf("order per round %v, variants %d", c.Order, len(c.Variants))
		}
		// A CPU and an allocation profile of every run, gzipped protos.
		section := sectionThroughput
		if c == res.Poison {
			section = sectionPoison
		}
		for _, v := range c.Variants {
			for round := 1; round <= rounds; round++ {
				for _, kind := range []string{"cpu", "allocs"} {
					path := filepath.Join(cfg.Profile, fmt.Sprintf("%s-%s-r%d.%s.pprof", section, v.Name, round, kind))
					if data := readGzip(t, path); len(data) == 0 {
						t.Errorf("%s: empty", path)
					}
				}
			}
		}
	}
	if p := readProfile(t, filepath.Join(cfg.Profile, "throughput-listener-r1.allocs.pprof")); len(p.samples) == 0 ||
		!slices.ContainsFunc(p.strings, func(s string) bool { return strings.HasPrefix(s, "github.com/amqpretry/amqpretry/listener.") }) {
		t.Errorf("the listener's allocation profile has %d samples and no listener function: %q", len(p.samples), p.strings)
	}
	if len(res.Goals) != 6 {
		t.Errorf("goals: %+v", res.Goals)
	}
	if got := len(res.Throughput.Variants); got != 5 {
		t.Errorf("throughput: %d variants, want 5", got)
	}
	if got := len(res.Poison.Variants); got != 4 {
		t.Errorf("poison flood: %d variants, want 4", got)
	}
	if s := res.ScaleUp; s == nil || s.SecondsFromRun <= 0 || s.SecondsFromFirst <= 0 || s.BrokerConsumers < 1 ||
		len(s.HandlerTimeline) == 0 || s.HandlerTimeline[len(s.HandlerTimeline)-1].Handlers != scaleTo || s.Goal.Measured != s.SecondsFromRun {
		t.Errorf("scale-up: %+v", res.ScaleUp)
	}
	checkSlowSmoke(t, res.Slow, out.String(), rounds)
	if res.Chain == nil || res.Chain.Chain.NsPerOp <= 0 {
		t.Errorf("chain overhead: %+v", res.Chain)
	}
	if !cfg.Skip[sectionOutbox] {
		if o := res.Outbox; o == nil || len(o.Throughput.Variants) != 2 || o.Throughput.Variants[1].MedianMsgPerSec <= 0 ||
			o.Throughput.Variants[1].RatioToBaseline <= 0 || o.Latency.P99MS <= 0 || o.Latency.P50MS > o.Latency.P99MS {
			t.Errorf("outbox: %+v", res.Outbox)
		} else if !strings.Contains(out.String(), "| outbox-relay |") || !strings.Contains(out.String(), "Commit to confirmed publish") {
			t.Errorf("the report lacks the outbox section:\n%s", out.String())
		}
	}
	if !cfg.Skip[sectionBatch] {
		checkBatchSmoke(t, res.Batch, out.String(), rounds)
	}
	if res.Schedule != nil {
		t.Error("the skipped retry schedule ran")
	}
	checkRetrySmoke(t, res.Retry, out.String(), rounds)
	checkCoalesceSmoke(t, res.Coalesce, out.String(), rounds)
	if res.Machine.BrokerVer == "" {
		t.Error("no broker version in the machine info")
	}

	for _, want := range []string{"| raw |", "| listener |", "| listener-otel |", "| otel-floor |", "| watermill |", "| raw-republish |", "| raw-annotated |", "| raw-per-copy |", "× raw-per-copy's", "Scale-up", "Chain overhead",
		"| CPU vs raw |", "| CPU vs raw-republish |", "Order per round: raw, listener,", "× otel-floor's", "Goals of issue 15", "**Profiled** (-profile "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
	data, err := os.ReadFile(filepath.Join(cfg.Out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	if len(back.Throughput.Variants[0].Samples) != rounds || len(back.Throughput.Order) != rounds || len(back.Poison.Order) != rounds ||
		back.Settings.Profile != cfg.Profile {
		t.Errorf("results.json lacks the raw samples, the order per round or the profile directory: %s", data)
	}
	if png, err := os.ReadFile(filepath.Join(cfg.Out, "throughput.png")); err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("throughput.png: not a PNG (%v)", err)
	}
}

// checkSlowSmoke checks the slow-handlers section of a smoke run: every
// variant measured each round, with handlers counted, and every goal
// measured (met or not: 200 messages are too few to judge).
func checkSlowSmoke(t *testing.T, s *SlowResult, report string, rounds int) {
	t.Helper()
	if s == nil || len(s.Variants) != 3 || len(s.Order) != rounds || s.IdealSeconds <= 0 {
		t.Fatalf("slow handlers: %+v", s)
	}
	for _, v := range s.Variants {
		if len(v.Samples) != rounds || v.MedianDrain <= 0 || v.MedianMsgPerSec <= 0 || v.MedianPeak < 1 || v.MedianPeak > slowTo {
			t.Errorf("slow %s: %+v", v.Name, v)
		}
		for _, sm := range v.Samples {
			if len(sm.Steps) == 0 || sm.BrokerConsumers < 1 {
				t.Errorf("slow %s sample: %+v", v.Name, sm)
			}
		}
	}
	if len(s.Goals) != 4 {
		t.Errorf("slow goals %+v", s.Goals)
	}
	for _, g := range s.Goals {
		if g.Measured == 0 {
			t.Errorf("slow goal not measured: %+v", g)
		}
	}
	for _, want := range []string{"## Slow handlers:", "| backlog-listener |", "| backlog-raw |", "| burst-listener |", "Goals of the slow handlers"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
}

// checkBatchSmoke checks the batch section of a smoke run: every variant
// measured each round (each run checks its table holds every message), and
// both goals measured.
func checkBatchSmoke(t *testing.T, b *BatchResult, report string, rounds int) {
	t.Helper()
	if b == nil || b.Runs == nil || len(b.Runs.Variants) != 4 || b.Runs.Baseline != "raw-batched" {
		t.Fatalf("batch section: %+v", b)
	}
	for _, v := range b.Runs.Variants {
		if len(v.Samples) != rounds || v.MedianMsgPerSec <= 0 || v.MedianCPUPerMsg <= 0 || v.RatioToBaseline <= 0 {
			t.Errorf("batch %s: %+v", v.Name, v)
		}
	}
	if len(b.Goals) != 2 || b.Goals[0].Measured <= 0 || b.Goals[1].Measured <= 0 {
		t.Errorf("batch goals %+v", b.Goals)
	}
	for _, want := range []string{"## Batch handler:", "| raw-batched |", "| raw-batched-ack-each |", "| per-message |", "| batch-handler |",
		"Goals of issue 28", "batch-handler msg/s ≥3.00× per-message"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
}

// checkRetrySmoke checks the retry section of a smoke run: measured on a
// RabbitMQ 4.3 broker, or skipped with a note where there is none (make
// test starts only 3.10 and 4.0).
func checkRetrySmoke(t *testing.T, rr *RetryResult, report string, rounds int) {
	t.Helper()
	if rr == nil {
		t.Fatal("no retry section")
	}
	if rr.Skipped != "" {
		t.Logf("retry section skipped: %s", rr.Skipped)
		if !strings.Contains(report, "Skipped: "+rr.Skipped) {
			t.Errorf("the report does not say why the retry section was skipped:\n%s", report)
		}
		return
	}
	if rr.Flood == nil || len(rr.Flood.Variants) != 5 {
		t.Fatalf("retry flood: %+v", rr.Flood)
	}
	for _, v := range rr.Flood.Variants {
		if len(v.Samples) != rounds || v.MedianMsgPerSec <= 0 || v.MedianCPUPerMsg <= 0 || v.RatioToBaseline <= 0 {
			t.Errorf("retry %s: %+v", v.Name, v)
		}
	}
	if len(rr.Waits) != 5 || len(rr.Goals) != 2 || rr.Goals[0].Measured <= 0 || rr.Goals[1].Measured <= 0 {
		t.Errorf("retry waits %+v, goals %+v", rr.Waits, rr.Goals)
	}
	for _, w := range rr.Waits {
		// Each timed message waits twice; a wait is never shorter than the
		// delay by more than a clock's jitter.
		if w.Waits < 2*rounds || w.MinErrMS < -5 {
			t.Errorf("retry waits of %s: %+v", w.Variant, w)
		}
	}
	p := rr.Parked
	if p == nil || len(p.Variants) != 2 {
		t.Fatalf("parked: %+v", p)
	}
	for _, v := range p.Variants {
		if v.ParkSeconds <= 0 || v.QueueMemoryAfter != -1 || v.RSSBefore <= 0 || v.RSSAfter <= 0 {
			t.Errorf("parked %s: %+v", v.Name, v)
		}
	}
	if p.CtlError != "no -retry-ctl command" || !strings.Contains(report, "Queue and node memory are not known: no -retry-ctl command") {
		t.Errorf("parked without rabbitmqctl: %q", p.CtlError)
	}
	for _, want := range []string{"## Retry flood on RabbitMQ 4.", "| raw-delayed |", "| delayed |", "| raw-tiers |", "| tiers |", "| local-retry |",
		"| CPU vs raw-delayed |", "Goals of the retry flood", "median error ms", "messages parked in a 60 s delay"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
}

// checkCoalesceSmoke checks the coalescing section of a smoke run: measured
// on the main broker, and on the RabbitMQ 4.3 one or skipped with a note.
func checkCoalesceSmoke(t *testing.T, results []*CoalesceResult, report string, rounds int) {
	t.Helper()
	if len(results) != 2 {
		t.Fatalf("coalescing section on %d brokers, want 2 (-url's and -retry-url's)", len(results))
	}
	for i, cr := range results {
		if cr.Skipped != "" {
			if i == 0 {
				t.Errorf("coalescing skipped on the main broker: %s", cr.Skipped)
			}
			if !strings.Contains(report, "Skipped: "+cr.Skipped) {
				t.Errorf("the report does not say why coalescing was skipped on %s", cr.URL)
			}
			continue
		}
		if cr.Flood == nil || len(cr.Flood.Variants) != 4 || cr.AckEvery != 62 {
			t.Fatalf("coalescing on %s: %+v", cr.Broker, cr)
		}
		for _, v := range cr.Flood.Variants {
			if len(v.Samples) != rounds || v.MedianMsgPerSec <= 0 || v.MedianCPUPerMsg <= 0 || v.RatioToBaseline <= 0 {
				t.Errorf("coalescing %s on %s: %+v", v.Name, cr.Broker, v)
			}
		}
		if len(cr.Goals) != 3 || cr.Goals[0].Measured <= 0 || cr.Goals[1].Measured <= 0 || cr.Goals[2].Measured <= 0 {
			t.Errorf("coalescing goals on %s: %+v", cr.Broker, cr.Goals)
		}
		for _, want := range []string{"## Ack coalescing on " + cr.Broker, "| raw-coalesced |", "| listener-coalesced |", "Goals of issue 28 on " + cr.Broker} {
			if !strings.Contains(report, want) {
				t.Errorf("the report lacks %q:\n%s", want, report)
			}
		}
	}
}
