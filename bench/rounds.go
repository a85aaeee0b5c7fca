package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/amqpretry/amqpretry/publisher"
	"runtime"
	"time"
)

// env is what every measurement shares.
type env struct {
	cfg    Config
	broker *broker
}

// variant is one way of consuming a filled queue: it consumes n messages
// from queue q and reports how fast, then stops everything it started.
type variant struct {
	name  string
	about string // one line for the report: what runs, with which settings
	run   func(ctx context.Context, e *env, q string, n int) (Sample, error)
	skip  bool // left out by -skip
}

// Comparison holds every sample of a set of variants and their medians.
type Comparison struct {
	Baseline string          `json:"baseline"`
	Messages int             `json:"messages_per_run"`
	Rounds   int             `json:"rounds"`
	Variants []VariantResult `json:"variants"`
}

// VariantResult is one variant's samples and medians. The ratio is the
// median's to the baseline's median (0 when the baseline was skipped).
type VariantResult struct {
	Name            string   `json:"name"`
	About           string   `json:"about"`
	Samples         []Sample `json:"samples"`
	MedianMsgPerSec float64  `json:"median_msg_per_sec"`
	RatioToBaseline float64  `json:"ratio_to_baseline"`
	MedianCPUPerMsg float64  `json:"median_cpu_us_per_msg"`
}

// compare runs the variants in interleaved rounds (a, b, c, a, b, c, ...) so
// that a drift in the machine's speed (the broker's memory, another process)
// spreads over all of them instead of landing on one, and takes medians.
func compare(ctx context.Context, e *env, section string, variants []variant, n int) (*Comparison, error) {
	c := &Comparison{Baseline: variants[0].name, Messages: n, Rounds: e.cfg.Rounds}
	results := make([]VariantResult, len(variants))
	for i, v := range variants {
		results[i] = VariantResult{Name: v.name, About: v.about}
	}
	for round := 1; round <= e.cfg.Rounds; round++ {
		for i, v := range variants {
			if v.skip {
				continue
			}
			s, err := runOnce(ctx, e, section, v, n)
			if err != nil {
				return nil, fmt.Errorf("%s %s, round %d: %w", section, v.name, round, err)
			}
			e.cfg.logf("%s round %d/%d %-14s %8.0f msg/s  %6.1f µs CPU/msg", section, round, e.cfg.Rounds, v.name, s.MsgPerSec, s.CPUPerMsg)
			results[i].Samples = append(results[i].Samples, s)
		}
	}
	var base float64
	for i := range results {
		r := &results[i]
		if len(r.Samples) == 0 {
			continue // skipped
		}
		var rates, cpus []float64
		for _, s := range r.Samples {
			rates = append(rates, s.MsgPerSec)
			cpus = append(cpus, s.CPUPerMsg)
		}
		r.MedianMsgPerSec, r.MedianCPUPerMsg = median(rates), median(cpus)
		if i == 0 {
			base = r.MedianMsgPerSec
		}
		if base > 0 {
			r.RatioToBaseline = r.MedianMsgPerSec / base
		}
		c.Variants = append(c.Variants, *r)
	}
	return c, nil
}

// runOnce gives v a fresh queue holding n messages, lets the broker settle,
// measures, and deletes the queue.
func runOnce(ctx context.Context, e *env, section string, v variant, n int) (s Sample, err error) {
	q := uniqueName(section + "." + v.name)
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
	runtime.GC() // the fill's garbage is not the variant's to collect
	return v.run(ctx, e, q, n)
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
