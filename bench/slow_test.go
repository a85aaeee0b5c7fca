package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestGauge(t *testing.T) {
	g := newGauge(3)
	if first, second := g.enter(), g.enter(); first || second {
		t.Fatal("reached 3 at 1 or 2 handlers")
	}
	g.leave()
	if g.enter() {
		t.Fatal("reached 3 at 2 handlers")
	}
	if !g.enter() {
		t.Fatal("3 handlers at once not reported")
	}
	g.leave()
	if g.enter() {
		t.Error("reaching 3 reported twice")
	}
	if _, ok := g.reachedAt(); !ok || g.highest() != 3 {
		t.Errorf("reached %v, highest %d", ok, g.highest())
	}
	steps := g.timeline()
	if len(steps) != 3 || steps[0].Handlers != 1 || steps[2].Handlers != 3 || steps[2].At < steps[0].At {
		t.Errorf("timeline %+v", steps)
	}
	if _, ok := newGauge(8).reachedAt(); ok {
		t.Error("a fresh gauge has reached its target")
	}
}

func TestLimitGoal(t *testing.T) {
	for _, c := range []struct {
		g    LimitGoal
		want string
	}{
		{newLimitGoal("drain ÷ ideal", true, 1.2, "×", 1.1), "✓ drain ÷ ideal ≤ 1.20×: 1.10×"},
		{newLimitGoal("listener ÷ raw", false, 0.9, "×", 0.5), "✗ listener ÷ raw ≥ 0.90×: 0.50×"},
		{newLimitGoal("to 8", true, 0.5, "s", 0.25), "✓ to 8 ≤ 0.50 s: 0.25 s"},
		{newLimitGoal("to 8", true, 0.5, "s", -1), "✗ to 8 ≤ 0.50 s: never"},
	} {
		if got := c.g.String(); got != c.want {
			t.Errorf("%q, want %q", got, c.want)
		}
	}
}

func TestStepsText(t *testing.T) {
	steps := []HandlerStep{{0, 1}, {0.2621, 2}, {0.2623, 3}, {0.2624, 4}, {0.5, 5}}
	if got, want := stepsText(steps), "1 at 0.000s, 2–4 at 0.262s, 5 at 0.500s"; got != want {
		t.Errorf("stepsText = %q, want %q", got, want)
	}
	if got := stepsText(nil); got != "no handler ran" {
		t.Errorf("stepsText(nil) = %q", got)
	}
}

func TestMedianOrNever(t *testing.T) {
	if got := medianOrNever([]float64{0.3, -1, 0.1}); got != 0.3 {
		t.Errorf("one never of three: %v, want 0.3", got)
	}
	if got := medianOrNever([]float64{-1, -1, 0.1}); got != -1 {
		t.Errorf("two nevers of three: %v, want -1", got)
	}
}

// The goals come from the medians: the listener's msg/s against raw's on
// the backlog, each drain against the ideal, the burst's time to 8.
func TestSlowSummarize(t *testing.T) {
	r := &SlowResult{Messages: 2000, HandlerMS: 20, From: 4, To: 8, IdealSeconds: idealDrain(2000).Seconds(), Rounds: 3,
		Variants: []SlowVariant{
			{Name: slowBacklogListener, DrainFrom: "run", Samples: []SlowSample{
				{Drain: 5.5, MsgPerSec: 2000 / 5.5, Peak: 8, ToMax: 0.3}, {Drain: 5.6, MsgPerSec: 2000 / 5.6, Peak: 8, ToMax: 0.2}, {Drain: 7, MsgPerSec: 2000 / 7.0, Peak: 8, ToMax: 0.25}}},
			{Name: slowBacklogRaw, DrainFrom: "run", Samples: []SlowSample{
				{Drain: 5.2, MsgPerSec: 2000 / 5.2, Peak: 8}, {Drain: 5.1, MsgPerSec: 2000 / 5.1, Peak: 8}, {Drain: 5.3, MsgPerSec: 2000 / 5.3, Peak: 8}}},
			{Name: slowBurstListener, DrainFrom: "first delivery", Samples: []SlowSample{
				{Drain: 6, MsgPerSec: 2000 / 6.0, Peak: 7, ToMax: -1, PublishSeconds: 0.1}, {Drain: 6.2, MsgPerSec: 2000 / 6.2, Peak: 8, ToMax: 0.6, PublishSeconds: 0.1},
				{Drain: 6.4, MsgPerSec: 2000 / 6.4, Peak: 8, ToMax: 0.4, PublishSeconds: 0.1}}},
		}}
	r.summarize()
	if r.IdealSeconds != 5 {
		t.Fatalf("ideal %v s, want 5", r.IdealSeconds)
	}
	b := r.variant(slowBacklogListener)
	if b.MedianDrain != 5.6 || !near(b.DrainToIdeal, 1.12) || b.MedianPeak != 8 || b.MedianToMax != 0.25 {
		t.Errorf("backlog-listener %+v", b)
	}
	if burst := r.variant(slowBurstListener); burst.MedianToMax != 0.6 || burst.MedianPeak != 8 {
		t.Errorf("burst-listener %+v", burst)
	}
	want := []struct {
		measured float64
		met      bool
	}{{(2000 / 5.6) / (2000 / 5.2), true}, {5.6 / 5, true}, {0.6, false}, {6.2 / 5, true}}
	if len(r.Goals) != len(want) {
		t.Fatalf("goals %+v", r.Goals)
	}
	for i, w := range want {
		if g := r.Goals[i]; !near(g.Measured, w.measured) || g.Met != w.met {
			t.Errorf("goal %d: %+v, want measured %v met %v", i, g, w.measured, w.met)
		}
	}
	var out bytes.Buffer
	writeSlow(&out, r)
	for _, s := range []string{"## Slow handlers: 2000 messages, 20 ms handler, 4 → 8 handlers at a time", "Ideal drain: 2000 × 20 ms ÷ 8 = 5.00 s",
		"| backlog-raw | run | 5.20 | 1.04 |", "**Goals of the slow handlers, 3 of 4 met:**", "- ✗ burst: first delivery → 8 handlers at once ≤ 0.50 s: 0.60 s"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("the report lacks %q:\n%s", s, out.String())
		}
	}
}

// near compares floats computed two ways.
func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSlowIsSkippable(t *testing.T) {
	if skip, err := parseSkip(sectionSlow); err != nil || !skip[sectionSlow] {
		t.Errorf("parseSkip(%q) = %v, %v", sectionSlow, skip, err)
	}
}
