package main

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestWaitAccuracy(t *testing.T) {
	var waits []time.Duration
	for i := 1; i <= 100; i++ { // 101ms to 200ms: errors of 1 to 100 ms
		waits = append(waits, 100*time.Millisecond+time.Duration(i)*time.Millisecond)
	}
	waits = append(waits, 99*time.Millisecond) // one early
	a, ok := waitAccuracy("delayed", waits, 100*time.Millisecond)
	if !ok {
		t.Fatal("no accuracy from 101 waits")
	}
	want := WaitAccuracy{Variant: "delayed", Waits: 101, ConfiguredMS: 100, MinErrMS: -1, MedianErrMS: 50, P95ErrMS: 95, MaxErrMS: 100}
	if a != want {
		t.Errorf("waitAccuracy = %+v\nwant           %+v", a, want)
	}
	if _, ok := waitAccuracy("none", nil, time.Second); ok {
		t.Error("an accuracy from no waits")
	}
}

// Every message fails its first two attempts and succeeds after, however
// its attempts are spread over goroutines; every k-th message has each wait
// after a failure timed, and only those.
func TestFlakyFailsEachMessageTwiceThenSucceeds(t *testing.T) {
	const n, failures, every, attempts = 200, 2, 10, 4
	f := newFlaky(n, failures, every)
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := map[string]int{}
	for range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				id := strconv.Itoa(i)
				if f.attempt(id) {
					mu.Lock()
					failed[id]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for i := range n {
		if got := failed[strconv.Itoa(i)]; got != failures {
			t.Fatalf("message %d failed %d of %d attempts, want %d", i, got, attempts, failures)
		}
	}
	// A message's attempts come one after the other (the broker delivers it
	// to one consumer at a time): each timed message's two failures are
	// each followed by a timed wait.
	f = newFlaky(n, failures, every)
	for range attempts {
		for i := range n {
			f.attempt(strconv.Itoa(i))
		}
	}
	if got, want := len(f.timedWaits()), n/every*failures; got != want {
		t.Errorf("%d waits timed, want %d", got, want)
	}
	for _, w := range f.timedWaits() {
		if w < 0 {
			t.Errorf("a negative wait: %v", w)
		}
	}
	for _, id := range []string{"", "x", "-1", strconv.Itoa(n)} {
		if f.attempt(id) {
			t.Errorf("attempt(%q) fails: an id the flood did not publish should count as unknown", id)
		}
	}
	if got := f.unknown.Load(); got != 4 {
		t.Errorf("%d unknown ids counted, want 4", got)
	}
}

// The retry section's logger leaves out only the listener's warning for
// each failed delivery.
func TestDropMessageKeepsOtherRecords(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(dropMessage{Handler: slog.NewTextHandler(&buf, nil), msg: "listener: message failed"}).With("queue", "q")
	l.Warn("listener: message failed", "error", "boom")
	l.WithGroup("g").Warn("listener: message failed")
	l.Warn("listener: connection lost", "error", "EOF")
	out := buf.String()
	if strings.Contains(out, "message failed") || !strings.Contains(out, "connection lost") || !strings.Contains(out, "queue=q") {
		t.Errorf("logged:\n%s", out)
	}
}

func TestRetryNamesAreSkippable(t *testing.T) {
	skip, err := parseSkip("delayed, raw-delayed,tiers,raw-tiers,local-retry,retry")
	if err != nil {
		t.Fatal(err)
	}
	if len(skip) != 6 {
		t.Errorf("parsed %v", skip)
	}
	for _, name := range append(sections, variantNames()...) {
		for _, r := range retryVariantNames() {
			if name == r {
				t.Errorf("%q names both a retry variant and another section or variant: -skip would leave out both", name)
			}
		}
	}
}

func TestRetryGoals(t *testing.T) {
	c := &Comparison{Variants: []VariantResult{
		{Name: "raw-delayed", MedianMsgPerSec: 10000},
		{Name: "delayed", MedianMsgPerSec: 9500},
		{Name: "tiers", MedianMsgPerSec: 5000},
	}}
	goals := retryGoals(c)
	if len(goals) != 2 || !goals[0].Met || goals[0].Measured != 0.95 || goals[1].Met || goals[1].Measured != 1.9 {
		t.Fatalf("goals: %+v", goals)
	}
	if got := goals[1].String(); got != "retry delayed msg/s ≥2.00× tiers: 1.90, **not met**" {
		t.Errorf("String() = %q", got)
	}
	c.Variants = c.Variants[:2] // tiers skipped
	if g := retryGoals(c)[1]; g.Measured != 0 || g.Met || !strings.HasSuffix(g.String(), "(not measured)") {
		t.Errorf("with tiers skipped: %+v, %s", g, g)
	}
}
