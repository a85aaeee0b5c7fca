package main

import (
	"slices"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	xs := []float64{3, 1, 2}
	median(xs)
	if xs[0] != 3 {
		t.Error("median sorted its argument in place")
	}
}

func TestParseSkip(t *testing.T) {
	skip, err := parseSkip(" schedule, watermill,,")
	if err != nil {
		t.Fatal(err)
	}
	if len(skip) != 2 || !skip[sectionSchedule] || !skip["watermill"] {
		t.Errorf("parseSkip = %v", skip)
	}
	if _, err := parseSkip("shedule"); err == nil {
		t.Error("parseSkip accepted a typo")
	}
	if skip, err := parseSkip("coalesce,raw-coalesced,listener-coalesced"); err != nil || len(skip) != 3 {
		t.Errorf("parseSkip of the coalescing section and its variants = %v, %v", skip, err)
	}
}

// The schedule test compares against Retry(5)'s documented waits.
func TestExpectedWaits(t *testing.T) {
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second}
	got := expectedWaits(5)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("expectedWaits(5) = %v, want %v", got, want)
		}
	}
}

func TestTally(t *testing.T) {
	tl := newTally(2)
	tl.begin()
	time.Sleep(time.Millisecond)
	tl.hit()
	tl.hit()
	tl.hit() // past the target: counted, done stays closed once
	select {
	case <-tl.done:
	default:
		t.Fatal("done not closed at the target")
	}
	if tl.elapsed() < time.Millisecond {
		t.Errorf("elapsed %v, want it to start at begin", tl.elapsed())
	}
}

// Over k rounds each of k variants runs first once, and every round runs
// them all.
func TestRoundOrder(t *testing.T) {
	list := []int{0, 2, 3} // variant 1 skipped
	want := [][]int{{0, 2, 3}, {2, 3, 0}, {3, 0, 2}, {0, 2, 3}}
	for i, w := range want {
		if got := roundOrder(list, i+1); !slices.Equal(got, w) {
			t.Errorf("round %d: %v, want %v", i+1, got, w)
		}
	}
	if list[0] != 0 || list[1] != 2 {
		t.Errorf("roundOrder changed its argument: %v", list)
	}
	if got := roundOrder(nil, 1); len(got) != 0 {
		t.Errorf("no variants: %v", got)
	}
}

func TestSummarize(t *testing.T) {
	c := &Comparison{Baseline: "raw", Variants: []VariantResult{
		{Name: "raw", Samples: []Sample{{MsgPerSec: 100, CPUPerMsg: 10}, {MsgPerSec: 300, CPUPerMsg: 30}, {MsgPerSec: 200, CPUPerMsg: 20}}},
		{Name: "listener", Samples: []Sample{{MsgPerSec: 150, CPUPerMsg: 30}}},
	}}
	c.summarize()
	raw, l := c.variant("raw"), c.variant("listener")
	if raw.MedianMsgPerSec != 200 || raw.RatioToBaseline != 1 || raw.CPURatioToBaseline != 1 {
		t.Errorf("raw: %+v", raw)
	}
	if l.RatioToBaseline != 0.75 || l.CPURatioToBaseline != 1.5 {
		t.Errorf("listener: %+v", l)
	}
	noBase := &Comparison{Baseline: "raw", Variants: []VariantResult{{Name: "listener", Samples: []Sample{{MsgPerSec: 1, CPUPerMsg: 1}}}}}
	noBase.summarize()
	if v := noBase.Variants[0]; v.RatioToBaseline != 0 || v.CPURatioToBaseline != 0 || v.MedianMsgPerSec != 1 {
		t.Errorf("baseline skipped: %+v", v)
	}
}
