package main

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/amqpretry/amqpretry/publisher"
)

// env is what every measurement shares.
type env struct {
	cfg       Config
	broker    *broker
	brokerPID int // the broker's process on this machine, or 0: see brokercpu.go
}

// variant is one way of consuming a filled queue: it consumes n messages
// from queue q and reports how fast, then stops everything it started.
type variant struct {
	name  string
	about string // one line for the report: what runs, with which settings
	run   func(ctx context.Context, e *env, q string, n int) (Sample, error)
	skip  bool // left out by -skip
	// ownQueue: run declares, fills and deletes the queues itself, from
	// q's name (the retry section's topologies), and is not profiled.
	ownQueue bool
	// share, when above 1, runs the variant on 1/share of the section's
	// messages: one many times slower than the rest (a database write per
	// message) then takes about as long as they do, and they run long
	// enough to be steady. Its samples say how many it handled.
	share int
}

// messages is how many of the section's n the variant runs on.
func (v variant) messages(n int) int {
	if v.share > 1 {
		return max(1, n/v.share)
	}
	return n
}

// Comparison holds every sample of a set of variants and their medians.
type Comparison struct {
	Baseline string          `json:"baseline"`
	Messages int             `json:"messages_per_run"`
	Rounds   int             `json:"rounds"`
	Variants []VariantResult `json:"variants"`
	// Order is, per round, the variants in the order they ran: round r
	// starts r-1 places further along the list (see roundOrder).
	Order [][]string `json:"order_per_round,omitempty"`
}

// VariantResult is one variant's samples and medians. The ratios are the
// medians' to the baseline's medians (0 when the baseline was skipped).
type VariantResult struct {
	Name               string   `json:"name"`
	About              string   `json:"about"`
	Samples            []Sample `json:"samples"` // in round order
	MedianMsgPerSec    float64  `json:"median_msg_per_sec"`
	RatioToBaseline    float64  `json:"ratio_to_baseline"`
	MedianCPUPerMsg    float64  `json:"median_cpu_us_per_msg"`
	CPURatioToBaseline float64  `json:"cpu_ratio_to_baseline"`
	// MedianBrokerCPUPerMsg is 0 when the broker's CPU was not measured.
	MedianBrokerCPUPerMsg float64 `json:"median_broker_cpu_us_per_msg,omitempty"`
}

// compare runs the variants in interleaved rounds so that a drift in the
// machine's speed (the broker's memory, another process) spreads over all of
// them instead of landing on one, and takes medians. Each round starts one
// variant further along (a, b, c; b, c, a; c, a, b; ...): whatever favours
// or penalises the first run after a pause, or a run's place behind
// another, does not always fall on the same variant.
func compare(ctx context.Context, e *env, section string, variants []variant, n int) (*Comparison, error) {
	c := &Comparison{Baseline: variants[0].name, Messages: n, Rounds: e.cfg.Rounds}
	results := make([]VariantResult, len(variants))
	var active []int // indexes of the variants not skipped
	for i, v := range variants {
		results[i] = VariantResult{Name: v.name, About: v.about}
		if !v.skip {
			active = append(active, i)
		}
	}
	for round := 1; round <= e.cfg.Rounds; round++ {
		order := roundOrder(active, round)
		var names []string
		for _, i := range order {
			names = append(names, variants[i].name)
		}
		c.Order = append(c.Order, names)
		for _, i := range order {
			v := variants[i]
			s, err := runOnce(ctx, e, section, v, v.messages(n), round)
			if err != nil {
				return nil, fmt.Errorf("%s %s, round %d: %w", section, v.name, round, err)
			}
			e.cfg.logf("%s round %d/%d %-14s %8.0f msg/s  %6.1f µs CPU/msg", section, round, e.cfg.Rounds, v.name, s.MsgPerSec, s.CPUPerMsg)
			results[i].Samples = append(results[i].Samples, s)
		}
	}
	for _, r := range results {
		if len(r.Samples) > 0 { // not skipped
			c.Variants = append(c.Variants, r)
		}
	}
	c.summarize()
	return c, nil
}

// roundOrder is the order of round (1-based): the list rotated by round-1,
// so that over k rounds each of k variants runs first once.
func roundOrder(list []int, round int) []int {
	if len(list) == 0 {
		return nil
	}
	k := (round - 1) % len(list)
	return append(slices.Clone(list[k:]), list[:k]...)
}

// summarize fills in the medians of every variant and their ratios to the
// baseline's, when the baseline ran.
func (c *Comparison) summarize() {
	var base *VariantResult
	for i := range c.Variants {
		v := &c.Variants[i]
		var rates, cpus, brokerCPUs []float64
		for _, s := range v.Samples {
			rates, cpus = append(rates, s.MsgPerSec), append(cpus, s.CPUPerMsg)
			if s.BrokerCPUPerMsg > 0 {
				brokerCPUs = append(brokerCPUs, s.BrokerCPUPerMsg)
			}
		}
		v.MedianMsgPerSec, v.MedianCPUPerMsg = median(rates), median(cpus)
		if len(brokerCPUs) == len(v.Samples) { // all or nothing: a median of some rounds would mislead
			v.MedianBrokerCPUPerMsg = median(brokerCPUs)
		}
		if v.Name == c.Baseline {
			base = v
		}
	}
	if base == nil {
		return
	}
	for i := range c.Variants {
		v := &c.Variants[i]
		v.RatioToBaseline = ratio(v.MedianMsgPerSec, base.MedianMsgPerSec)
		v.CPURatioToBaseline = ratio(v.MedianCPUPerMsg, base.MedianCPUPerMsg)
	}
}

// brokerCPUKnown reports whether every variant has the broker's CPU.
func (c *Comparison) brokerCPUKnown() bool {
	for _, v := range c.Variants {
		if v.MedianBrokerCPUPerMsg <= 0 {
			return false
		}
	}
	return len(c.Variants) > 0
}

// variant returns the named variant's result, or nil if it did not run.
func (c *Comparison) variant(name string) *VariantResult {
	if c == nil {
		return nil
	}
	for i := range c.Variants {
		if c.Variants[i].Name == name {
			return &c.Variants[i]
		}
	}
	return nil
}

// ratio is a/b, or 0 when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// runOnce gives v a fresh queue holding n messages, lets the broker settle,
// measures, and deletes the queue. With -profile, the measured run (not the
// fill) is CPU-profiled and its allocations are written after it.
func runOnce(ctx context.Context, e *env, section string, v variant, n, round int) (s Sample, err error) {
	q := uniqueName(section + "." + v.name)
	if v.ownQueue {
		return v.run(ctx, e, q, n)
	}
	cleanup, err := e.broker.queues(q)
	if err != nil {
		return Sample{}, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	if err := e.broker.fill(ctx, q, n); err != nil {
		return Sample{}, err
	}
	if err := sleep(ctx, e.cfg.Settle); err != nil {
		return Sample{}, err
	}
	settleHeap()
	if e.cfg.Profile == "" {
		return v.run(ctx, e, q, n)
	}
	p, err := startProfile(e.cfg.Profile, fmt.Sprintf("%s-%s-r%d", section, v.name, round))
	if err != nil {
		return Sample{}, err
	}
	s, err = v.run(ctx, e, q, n)
	return s, errors.Join(err, p.stop())
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// withRecovery declares queues and opens a publisher for the recoverer, as
// every measurement through our chain needs; done deletes and closes them.
func (e *env) withRecovery(queues ...string) (pub *publisher.Publisher, done func() error, err error) {
	cleanup, err := e.broker.queues(queues...)
	if err != nil {
		return nil, nil, err
	}
	pub, err = publisher.New(e.broker.url, publisher.WithLogger(quietLogger()))
	if err != nil {
		return nil, nil, errors.Join(err, cleanup())
	}
	return pub, func() error { return errors.Join(pub.Close(), cleanup()) }, nil
}

// settleHeap collects the fill's garbage and hands the freed memory back to
// the OS before a measurement: after runtime.GC alone, Go's background
// scavenger returns it during the run, and a profile of the listener showed
// it (madvise) at ~5 % of a run's CPU, landing on whichever variant ran.
func settleHeap() { debug.FreeOSMemory() }
