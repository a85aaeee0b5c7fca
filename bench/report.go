package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Results is everything one run measured; it is written as results.json.
type Results struct {
	Machine    Machine           `json:"machine"`
	Settings   Settings          `json:"settings"`
	Throughput *Comparison       `json:"throughput,omitempty"`
	Coalesce   []*CoalesceResult `json:"coalesce,omitempty"`
	Poison     *Comparison       `json:"poison_flood,omitempty"`
	Schedule   *Schedule         `json:"retry_schedule,omitempty"`
	ScaleUp    *ScaleUp          `json:"scale_up,omitempty"`
	Slow       *SlowResult       `json:"slow_handlers,omitempty"`
	Chain      *ChainOverhead    `json:"chain_overhead,omitempty"`
	Outbox     *OutboxResult     `json:"outbox,omitempty"`
	Retry      *RetryResult      `json:"retry,omitempty"`
	Batch      *BatchResult      `json:"batch,omitempty"`
	Goals      []Goal            `json:"goals,omitempty"`
	WallSecs   float64           `json:"wall_seconds"`
}

// Machine says where the numbers come from: they mean little without it.
type Machine struct {
	Date       string `json:"date"`
	GoVersion  string `json:"go_version"`
	OSArch     string `json:"os_arch"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Broker     string `json:"broker"`
	BrokerVer  string `json:"broker_version"`
	Platform   string `json:"broker_platform"`
	// The 1-minute load average before and after: the cores are shared with
	// the broker and whatever else runs, and a busy host explains outliers.
	LoadBefore float64 `json:"load_avg_1m_before"`
	LoadAfter  float64 `json:"load_avg_1m_after"`
}

// loadAverage is the 1-minute load average, or 0 where /proc has none.
func loadAverage() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var load float64
	_, _ = fmt.Sscan(string(data), &load)
	return load
}

// Settings are the knobs the run used.
type Settings struct {
	Rounds         int      `json:"rounds"`
	Messages       int      `json:"messages"`
	PoisonMessages int      `json:"poison_messages"`
	Consumers      int      `json:"consumers"`
	Prefetch       int      `json:"prefetch"`
	SettleSeconds  float64  `json:"settle_seconds"`
	Skipped        []string `json:"skipped,omitempty"`
	// Profile is -profile's directory: the throughput and poison-flood runs
	// were profiled, and slower for it.
	Profile string `json:"profile_dir,omitempty"`
}

func machineInfo(b *broker) Machine {
	product, version, platform := b.serverInfo()
	return Machine{
		GoVersion:  runtime.Version(),
		OSArch:     runtime.GOOS + "/" + runtime.GOARCH,
		NumCPU:     runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Broker:     product,
		BrokerVer:  version,
		Platform:   platform,
		LoadBefore: loadAverage(),
	}
}

// writeJSON writes dir/results.json.
func writeJSON(dir string, r *Results) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomically(filepath.Join(dir, "results.json"), bytes.NewReader(append(data, '\n')))
}

// writeMarkdown prints the report: the tables first, then the details.
func writeMarkdown(w io.Writer, r *Results) {
	m := r.Machine
	fmt.Fprintf(w, "# amqpretry bench, %s\n\n", m.Date)
	fmt.Fprintf(w, "%s %s, %d CPUs, GOMAXPROCS %d; %s %s (%s) on the same machine; load average %.2f before, %.2f after\n\n",
		m.GoVersion, m.OSArch, m.NumCPU, m.GOMAXPROCS, m.Broker, m.BrokerVer, m.Platform, m.LoadBefore, m.LoadAfter)
	if r.Settings.Profile != "" {
		fmt.Fprintf(w, "**Profiled** (-profile %s): the throughput and poison-flood runs below ran under the CPU profiler and are slower than unprofiled runs.\n\n",
			r.Settings.Profile)
	}
	if c := r.Throughput; c != nil {
		fmt.Fprintf(w, "## Happy path: %d ready messages, %d consumers, prefetch %d (median of %d rounds, each starting one variant further along)\n\n",
			c.Messages, r.Settings.Consumers, r.Settings.Prefetch, c.Rounds)
		writeComparison(w, c)
		writeOTelCost(w, c)
	}
	writeCoalesce(w, r.Coalesce, r.Settings)
	if c := r.Poison; c != nil {
		fmt.Fprintf(w, "## Poison flood: %d messages, all failing for good, each to the DLQ with a confirm (median of %d rounds, each starting one variant further along)\n\n",
			c.Messages, c.Rounds)
		writeComparison(w, c)
		writePoisonCost(w, c)
	}
	writeGoals(w, "issue 15", r.Goals)
	if s := r.Schedule; s != nil {
		fmt.Fprintf(w, "## Retry schedule: Retry(%d), default backoff, one failing message\n\n", scheduleAttempts)
		fmt.Fprintln(w, "| wait after attempt | expected ms | actual ms | deviation ms |")
		fmt.Fprintln(w, "|---|---:|---:|---:|")
		for _, g := range s.Gaps {
			fmt.Fprintf(w, "| %d | %.0f | %.1f | %+.1f |\n", g.After, g.ExpectedMS, g.ActualMS, g.DeviationMS)
		}
		fmt.Fprintln(w)
	}
	if s := r.ScaleUp; s != nil {
		fmt.Fprintf(w, "## Scale-up: %d → %d handlers at a time, %.0fms handler, %d-message backlog\n\n", s.From, s.To, s.HandlerMS, s.Backlog)
		fmt.Fprintf(w, "%d handlers ran at once %.2fs after the first delivery (%.2fs after Run, dial included), %d messages handled by then; "+
			"the broker showed %d consumers (the listener's channels) just after.\n",
			s.To, s.SecondsFromFirst, s.SecondsFromRun, s.HandledBeforeScale, s.BrokerConsumers)
		var steps []HandlerStep // the same text as the slow section's, from Run here
		for _, st := range s.HandlerTimeline {
			steps = append(steps, HandlerStep(st))
		}
		fmt.Fprintf(w, "Most handlers at a time, as counted in the handler, from Run: %s.\n\n", stepsText(steps))
		writeLimitGoals(w, "the scale-up", []LimitGoal{s.Goal})
	}
	if c := r.Chain; c != nil {
		fmt.Fprintln(w, "## Chain overhead: Chain(Retry(5), Recover(r)) on the success path, no broker")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| call | ns/op | allocs/op | B/op |")
		fmt.Fprintln(w, "|---|---:|---:|---:|")
		fmt.Fprintf(w, "| handler directly | %.1f | %d | %d |\n", c.Direct.NsPerOp, c.Direct.AllocsPerOp, c.Direct.BytesPerOp)
		fmt.Fprintf(w, "| through the chain | %.1f | %d | %d |\n", c.Chain.NsPerOp, c.Chain.AllocsPerOp, c.Chain.BytesPerOp)
		fmt.Fprintf(w, "\nOverhead: %.0f ns and %d allocations per message.\n\n", c.Chain.NsPerOp-c.Direct.NsPerOp, c.Chain.AllocsPerOp-c.Direct.AllocsPerOp)
	}
	if o := r.Outbox; o != nil {
		fmt.Fprintf(w, "## Outbox: the relay draining %d committed rows against raw confirmed publishing of as many (median of %d rounds)\n\n",
			o.Throughput.Messages, o.Throughput.Rounds)
		writeComparison(w, o.Throughput)
		l := o.Latency
		fmt.Fprintf(w, "Commit to confirmed publish (the row's sent_at), %d orders committed one by one at %.0f/s, relay polling every %.0fms: "+
			"p50 %.1fms, p90 %.1fms, p99 %.1fms, max %.1fms.\n\n", l.Messages, l.RatePerSec, l.PollIntervalMS, l.P50MS, l.P90MS, l.P99MS, l.MaxMS)
	}
	if s := r.Slow; s != nil {
		writeSlow(w, s)
	}
	if b := r.Batch; b != nil {
		writeBatch(w, b, r.Settings)
	}
	if rr := r.Retry; rr != nil {
		writeRetry(w, rr, r.Settings)
	}
	fmt.Fprintf(w, "Total wall time %.0fs.\n", r.WallSecs)
}

func writeComparison(w io.Writer, c *Comparison) {
	broker := c.brokerCPUKnown()
	brokerHead, brokerRule := "", ""
	if broker {
		brokerHead, brokerRule = " broker CPU µs/msg (median) |", "---:|"
	}
	fmt.Fprintf(w, "| variant | msg/s (median) | msg/s vs %s | CPU vs %s | CPU µs/msg (median) |%s samples msg/s |\n", c.Baseline, c.Baseline, brokerHead)
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|%s---|\n", brokerRule)
	for _, v := range c.Variants {
		var samples []string
		for _, s := range v.Samples {
			samples = append(samples, fmt.Sprintf("%.0f", s.MsgPerSec))
		}
		brokerCell := ""
		if broker {
			brokerCell = fmt.Sprintf(" %.1f |", v.MedianBrokerCPUPerMsg)
		}
		fmt.Fprintf(w, "| %s | %.0f | %s | %s | %.1f |%s %s |\n", v.Name, v.MedianMsgPerSec, ratioText(v.RatioToBaseline), ratioText(v.CPURatioToBaseline),
			v.MedianCPUPerMsg, brokerCell, strings.Join(samples, ", "))
	}
	if broker {
		fmt.Fprintln(w, "\nCPU is the client's (this process). Broker CPU is the broker's process over the same span, on the same cores; it includes whatever else the broker did meanwhile.")
	}
	fmt.Fprintln(w)
	writeOrder(w, c.Order)
	for _, v := range c.Variants {
		fmt.Fprintf(w, "- **%s**: %s\n", v.Name, v.About)
	}
	fmt.Fprintln(w)
}

// ratioText is a ratio to two places, or a dash when there is none (the
// baseline was skipped).
func ratioText(r float64) string {
	if r <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", r)
}

// writePoisonCost splits the listener's CPU per message in the poison flood
// into the raw republish loop, what the fault headers cost amqp091 and the
// broker (raw-annotated over raw-republish), what the shape of a synchronous
// Recoverer costs (raw-per-copy over raw-annotated), and what is ours.
func writePoisonCost(w io.Writer, c *Comparison) {
	l, ann, per, raw := c.variant("listener"), c.variant("raw-annotated"), c.variant("raw-per-copy"), c.variant("raw-republish")
	if l == nil || ann == nil || per == nil || raw == nil {
		return
	}
	fmt.Fprintf(w, "The listener's CPU per message is %.2f× raw-per-copy's and %.2f× raw-annotated's; its msg/s %.2f× raw-per-copy's and %.2f× raw-annotated's. "+
		"Of its %.1f µs, the raw republish loop takes %.1f, the fault headers on the copy %.1f (raw-annotated − raw-republish), "+
		"a goroutine per delivery waiting for its own confirm %.1f (raw-per-copy − raw-annotated), "+
		"and the listener, middleware, recoverer and publisher %.1f (listener − raw-per-copy).\n\n",
		ratio(l.MedianCPUPerMsg, per.MedianCPUPerMsg), ratio(l.MedianCPUPerMsg, ann.MedianCPUPerMsg),
		ratio(l.MedianMsgPerSec, per.MedianMsgPerSec), ratio(l.MedianMsgPerSec, ann.MedianMsgPerSec), l.MedianCPUPerMsg,
		raw.MedianCPUPerMsg, ann.MedianCPUPerMsg-raw.MedianCPUPerMsg, per.MedianCPUPerMsg-ann.MedianCPUPerMsg, l.MedianCPUPerMsg-per.MedianCPUPerMsg)
	if c.brokerCPUKnown() {
		fmt.Fprintf(w, "On the broker, the copies with fault headers cost %.1f µs of CPU per message against %.1f for bare ones (raw-annotated against raw-republish, %.2f×): "+
			"the broker shares the cores, so the headers alone bring raw-annotated to %.2f× raw-republish's msg/s, before any of our code runs. "+
			"Under the listener the broker spends %.1f µs per message.\n\n",
			ann.MedianBrokerCPUPerMsg, raw.MedianBrokerCPUPerMsg, ratio(ann.MedianBrokerCPUPerMsg, raw.MedianBrokerCPUPerMsg),
			ann.RatioToBaseline, l.MedianBrokerCPUPerMsg)
	}
}

// writeOTelCost splits listener-otel's CPU per message into what the SDK
// costs at the least for the same output (otel-floor over raw) and what
// the listener adds.
func writeOTelCost(w io.Writer, c *Comparison) {
	lo, floor, raw, l := c.variant("listener-otel"), c.variant("otel-floor"), c.variant("raw"), c.variant("listener")
	if lo == nil || floor == nil || raw == nil {
		return
	}
	fmt.Fprintf(w, "listener-otel's CPU per message is %.2f× otel-floor's and %.2f× raw's. Of its %.1f µs, raw consumption takes %.1f, "+
		"the OTel SDK's least for the same spans and metrics %.1f (otel-floor − raw), and the listener's own work, telemetry included, %.1f (listener-otel − otel-floor)",
		ratio(lo.MedianCPUPerMsg, floor.MedianCPUPerMsg), ratio(lo.MedianCPUPerMsg, raw.MedianCPUPerMsg), lo.MedianCPUPerMsg,
		raw.MedianCPUPerMsg, floor.MedianCPUPerMsg-raw.MedianCPUPerMsg, lo.MedianCPUPerMsg-floor.MedianCPUPerMsg)
	if l != nil {
		fmt.Fprintf(w, "; without telemetry the listener adds %.1f (listener − raw)", l.MedianCPUPerMsg-raw.MedianCPUPerMsg)
	}
	fmt.Fprint(w, ".\n\n")
}

// Goal is one of issue 15's targets: the variant's median msg/s or CPU per
// message as a multiple of another's, at least or at most Limit.
type Goal struct {
	Section  string  `json:"section"`
	Variant  string  `json:"variant"`
	Measure  string  `json:"measure"` // "msg/s" or "CPU"
	Against  string  `json:"against"`
	AtMost   bool    `json:"at_most"` // else at least
	Limit    float64 `json:"limit"`
	Measured float64 `json:"measured,omitempty"` // 0: not measured (a variant skipped)
	Met      bool    `json:"met"`
}

func (g Goal) String() string {
	cmp := "≥"
	if g.AtMost {
		cmp = "≤"
	}
	variant := g.Variant
	if g.Section == sectionPoison || g.Section == sectionRetry {
		variant = g.Section + " " + variant
	}
	target := fmt.Sprintf("%s %s %s%.2f× %s", variant, g.Measure, cmp, g.Limit, g.Against)
	switch {
	case g.Measured == 0:
		return target + " (not measured)"
	case g.Met:
		return fmt.Sprintf("%s: %.2f, met", target, g.Measured)
	default:
		return fmt.Sprintf("%s: %.2f, **not met**", target, g.Measured)
	}
}

// issueGoals checks the run's medians against issue 15's targets.
func issueGoals(r *Results) []Goal {
	goals := []Goal{
		{Section: sectionThroughput, Variant: "listener", Measure: "msg/s", Against: "raw", Limit: 0.95},
		{Section: sectionThroughput, Variant: "listener", Measure: "CPU", Against: "raw", AtMost: true, Limit: 1.10},
		{Section: sectionThroughput, Variant: "listener-otel", Measure: "msg/s", Against: "raw", Limit: 0.85},
		{Section: sectionThroughput, Variant: "listener-otel", Measure: "CPU", Against: "otel-floor", AtMost: true, Limit: 1.15},
		{Section: sectionPoison, Variant: "listener", Measure: "msg/s", Against: "raw-republish", Limit: 0.8},
		{Section: sectionPoison, Variant: "listener", Measure: "CPU", Against: "raw-republish", AtMost: true, Limit: 1.5},
	}
	var kept []Goal
	for _, g := range goals {
		c := r.Throughput
		if g.Section == sectionPoison {
			c = r.Poison
		}
		if c == nil {
			continue // the section did not run
		}
		kept = append(kept, g.evaluate(c))
	}
	return kept
}

// evaluate measures g on the comparison that has its variants; Measured
// stays 0 when one of them did not run.
func (g Goal) evaluate(c *Comparison) Goal {
	v, base := c.variant(g.Variant), c.variant(g.Against)
	if v != nil && base != nil {
		if g.Measure == "CPU" {
			g.Measured = ratio(v.MedianCPUPerMsg, base.MedianCPUPerMsg)
		} else {
			g.Measured = ratio(v.MedianMsgPerSec, base.MedianMsgPerSec)
		}
		g.Met = g.Measured > 0 && (g.AtMost && g.Measured <= g.Limit || !g.AtMost && g.Measured >= g.Limit)
	}
	return g
}

// writeGoals prints goals in one line, titled "Goals of <of>", with how
// many were met; nothing when there are none.
func writeGoals(w io.Writer, of string, goals []Goal) {
	if len(goals) == 0 {
		return
	}
	var parts []string
	met := 0
	for _, g := range goals {
		parts = append(parts, g.String())
		if g.Met {
			met++
		}
	}
	fmt.Fprintf(w, "**Goals of %s, %d of %d met:** %s.\n\n", of, met, len(goals), strings.Join(parts, "; "))
}

// LimitGoal is a target on one measured number rather than on a ratio of
// two variants' medians (Goal): a ratio (Unit "×") or a time (Unit "s"),
// at most or at least Limit.
type LimitGoal struct {
	What   string  `json:"what"`
	AtMost bool    `json:"at_most"` // else at least
	Limit  float64 `json:"limit"`
	Unit   string  `json:"unit"`
	// Measured is -1 when what it times never happened (8 handlers never
	// ran at once), which meets no goal.
	Measured float64 `json:"measured"`
	Met      bool    `json:"met"`
}

func newLimitGoal(what string, atMost bool, limit float64, unit string, measured float64) LimitGoal {
	g := LimitGoal{What: what, AtMost: atMost, Limit: limit, Unit: unit, Measured: measured}
	g.Met = measured >= 0 && (atMost && measured <= limit || !atMost && measured >= limit)
	return g
}

func (g LimitGoal) String() string {
	mark, cmp, value := "✗", "≥", "never"
	if g.Met {
		mark = "✓"
	}
	if g.AtMost {
		cmp = "≤"
	}
	if g.Measured >= 0 {
		value = unitText(g.Measured, g.Unit)
	}
	return fmt.Sprintf("%s %s %s %s: %s", mark, g.What, cmp, unitText(g.Limit, g.Unit), value)
}

// unitText is v to two places in unit: "1.20×", "0.50 s".
func unitText(v float64, unit string) string {
	if unit == "×" {
		return fmt.Sprintf("%.2f×", v)
	}
	return fmt.Sprintf("%.2f %s", v, unit)
}

// writeLimitGoals prints goals one to a line, ✓ for met and ✗ for not,
// under a line that says how many were met; nothing when there are none.
func writeLimitGoals(w io.Writer, of string, goals []LimitGoal) {
	if len(goals) == 0 {
		return
	}
	met := 0
	for _, g := range goals {
		if g.Met {
			met++
		}
	}
	fmt.Fprintf(w, "**Goals of %s, %d of %d met:**\n\n", of, met, len(goals))
	for _, g := range goals {
		fmt.Fprintf(w, "- %s\n", g)
	}
	fmt.Fprintln(w)
}

// writeRetry prints the retry section: the flood's table and goals, the
// waits' accuracy and the parked messages' memory, or why it was skipped.
func writeRetry(w io.Writer, rr *RetryResult, set Settings) {
	if rr.Skipped != "" {
		fmt.Fprintf(w, "## Retry flood: skipped\n\nSkipped: %s.\n\n", rr.Skipped)
		return
	}
	if c := rr.Flood; c != nil {
		fmt.Fprintf(w, "## Retry flood on %s: %d ready messages, each failing %d times and then succeeding, %.0f ms waits, %d consumers, prefetch %d, quorum queues "+
			"(median of %d rounds, each starting one variant further along)\n\n",
			rr.Broker, c.Messages, rr.Failures, rr.DelayMS, set.Consumers, set.Prefetch, c.Rounds)
		fmt.Fprintln(w, "msg/s is messages handled successfully per second, from the first delivery to the last success; CPU per message is per message handled, "+
			"its three attempts together.")
		fmt.Fprintln(w)
		writeComparison(w, c)
		writeGoals(w, "the retry flood", rr.Goals)
	}
	if len(rr.Waits) > 0 {
		fmt.Fprintf(w, "Waits as the handler saw them, minus the configured %.0f ms: from the start of a failing attempt (the rejection or republish follows at once) "+
			"to the start of the same message's next attempt, for one message in %d of each run, all rounds. Under the flood a message that is due "+
			"still queues behind the others, in the broker and in the consumer's prefetch.\n\n", rr.DelayMS, max(1, rr.Flood.Messages/retryTimedMessages))
		fmt.Fprintln(w, "| variant | waits | min error ms | median error ms | p95 error ms | max error ms |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
		for _, a := range rr.Waits {
			fmt.Fprintf(w, "| %s | %d | %+.1f | %+.1f | %+.1f | %+.1f |\n", a.Variant, a.Waits, a.MinErrMS, a.MedianErrMS, a.P95ErrMS, a.MaxErrMS)
		}
		fmt.Fprintln(w)
	}
	if p := rr.Parked; p != nil {
		fmt.Fprintf(w, "### %d messages parked in a %.0f s delay\n\n", p.Messages, p.DelaySeconds)
		fmt.Fprintln(w, "| variant | parked in s | queue memory before → after | per message | node memory before → after | per message | broker RSS before → after | per message |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, v := range p.Variants {
			fmt.Fprintf(w, "| %s | %.1f | %s → %s | %s | %s → %s | %s | %s → %s | %s |\n", v.Name, v.ParkSeconds,
				bytesText(v.QueueMemoryBefore), bytesText(v.QueueMemoryAfter), perMessage(v.QueueMemoryBefore, v.QueueMemoryAfter, p.Messages),
				bytesText(v.NodeMemoryBefore), bytesText(v.NodeMemoryAfter), perMessage(v.NodeMemoryBefore, v.NodeMemoryAfter, p.Messages),
				bytesText(v.RSSBefore), bytesText(v.RSSAfter), perMessage(v.RSSBefore, v.RSSAfter, p.Messages))
		}
		fmt.Fprintln(w)
		memory := fmt.Sprintf("Queue memory is `%s list_queues memory` summed over the topology's queues (work queue, DLQ, tier); "+
			"node memory is the broker's Erlang VM's, `%s eval 'erlang:memory(total).'`", p.Ctl, p.Ctl)
		if p.CtlError != "" {
			memory = fmt.Sprintf("Queue and node memory are not known: %s", p.CtlError)
		}
		fmt.Fprintf(w, "%s; broker RSS is the broker process's VmRSS; each with the topology declared and empty, then with every message parked. "+
			"The variants run one after the other, on a broker others may use; the VM keeps memory it has freed, so the RSS difference is a rough guide.\n\n", memory)
		for _, v := range p.Variants {
			fmt.Fprintf(w, "- **%s**: %s\n", v.Name, v.About)
		}
		fmt.Fprintln(w)
	}
}

// perMessage is the growth from before to after, per message, in bytes; a
// dash when either is unknown.
func perMessage(before, after int64, n int) string {
	if before < 0 || after < 0 || n <= 0 {
		return "–"
	}
	return fmt.Sprintf("%d B", int64(math.Round(float64(after-before)/float64(n))))
}

// writeBatch prints the batch section: the table and its goals.
func writeBatch(w io.Writer, b *BatchResult, set Settings) {
	c := b.Runs
	fmt.Fprintf(w, "## Batch handler: %d ready messages written to PostgreSQL, one INSERT each against one multi-row INSERT per batch of %d, "+
		"%d consumers, prefetch %d (median of %d rounds, each starting one variant further along)\n\n",
		c.Messages, b.BatchSize, set.Consumers, set.Prefetch, c.Rounds)
	fmt.Fprintf(w, "msg/s is rows written per second, from the first delivery to the last row; a partial batch waits %.0f ms. Each run writes a fresh table, "+
		"checked afterwards to hold every message once. per-message runs on %d messages, a fifth of the others', so that its runs last about as long as theirs.\n\n",
		b.WaitMS, max(1, c.Messages/perMessageShare))
	writeComparison(w, c)
	writeGoals(w, "issue 28", b.Goals)
}

// writeOrder prints the order the variants ran in, round by round, when
// there was more than one round.
func writeOrder(w io.Writer, order [][]string) {
	if len(order) <= 1 {
		return
	}
	var rounds []string
	for _, names := range order {
		rounds = append(rounds, strings.Join(names, ", "))
	}
	fmt.Fprintf(w, "Order per round: %s.\n\n", strings.Join(rounds, "; "))
}
