package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Results is everything one run measured; it is written as results.json.
type Results struct {
	Machine    Machine        `json:"machine"`
	Settings   Settings       `json:"settings"`
	Throughput *Comparison    `json:"throughput,omitempty"`
	Poison     *Comparison    `json:"poison_flood,omitempty"`
	Schedule   *Schedule      `json:"retry_schedule,omitempty"`
	ScaleUp    *ScaleUp       `json:"scale_up,omitempty"`
	Chain      *ChainOverhead `json:"chain_overhead,omitempty"`
	Outbox     *OutboxResult  `json:"outbox,omitempty"`
	WallSecs   float64        `json:"wall_seconds"`
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
	if c := r.Throughput; c != nil {
		fmt.Fprintf(w, "## Happy path: %d ready messages, %d consumers, prefetch %d (median of %d rounds)\n\n",
			c.Messages, r.Settings.Consumers, r.Settings.Prefetch, c.Rounds)
		writeComparison(w, c)
	}
	if c := r.Poison; c != nil {
		fmt.Fprintf(w, "## Poison flood: %d messages, all failing for good, each to the DLQ with a confirm (median of %d rounds)\n\n",
			c.Messages, c.Rounds)
		writeComparison(w, c)
	}
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
		fmt.Fprintf(w, "## Scale-up: %d → %d consumers, %.0fms handler, %d-message backlog\n\n", s.From, s.To, s.HandlerMS, s.Backlog)
		fmt.Fprintf(w, "The broker reported %d consumers %.2fs after the first delivery (%.2fs after Run, dial included), %d messages handled by then.\n",
			s.To, s.SecondsFromFirst, s.SecondsFromRun, s.HandledBeforeScale)
		var steps []string
		for _, st := range s.ConsumerTimeline {
			steps = append(steps, fmt.Sprintf("%d at %.2fs", st.Consumers, st.Seconds))
		}
		fmt.Fprintf(w, "Consumer count as polled every %v: %s.\n\n", scalePoll, strings.Join(steps, ", "))
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
	fmt.Fprintf(w, "Total wall time %.0fs.\n", r.WallSecs)
}

func writeComparison(w io.Writer, c *Comparison) {
	fmt.Fprintf(w, "| variant | msg/s (median) | ratio to %s | CPU µs/msg (median) | samples msg/s |\n", c.Baseline)
	fmt.Fprintln(w, "|---|---:|---:|---:|---|")
	for _, v := range c.Variants {
		ratio := "–" // the baseline was skipped
		if v.RatioToBaseline > 0 {
			ratio = fmt.Sprintf("%.2f", v.RatioToBaseline)
		}
		var samples []string
		for _, s := range v.Samples {
			samples = append(samples, fmt.Sprintf("%.0f", s.MsgPerSec))
		}
		fmt.Fprintf(w, "| %s | %.0f | %s | %.1f | %s |\n", v.Name, v.MedianMsgPerSec, ratio, v.MedianCPUPerMsg, strings.Join(samples, ", "))
	}
	fmt.Fprintln(w)
	for _, v := range c.Variants {
		fmt.Fprintf(w, "- **%s**: %s\n", v.Name, v.About)
	}
	fmt.Fprintln(w)
}
