package main

import (
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
