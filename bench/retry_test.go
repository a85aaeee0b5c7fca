package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amqpretry/amqpretry/dlx"
)

// rabbitmqctl list_queues -q --no-table-headers name messages messages_ready
// messages_unacknowledged memory, as RabbitMQ 4.3.6 prints it: a queue
// whose counts the broker has not reported yet has empty fields.
func TestParseQueueList(t *testing.T) {
	out := "name\tmessages\tmessages_ready\tmessages_unacknowledged\tmemory\n" + // a header, should one come
		"orders\t100000\t0\t0\t48023416\n" +
		"orders.dlq\t0\t0\t0\t68116\r\n" +
		"fresh\t\t\t\t47772\n" +
		"odd\tname\t3\t1\t2\t9000\n" + // a tab in the name
		"Listing queues for vhost / ...\n" +
		"short\t1\t2\n" +
		"garbage\tx\t1\t2\t3\n" +
		"\n"
	got := parseQueueList(out)
	want := map[string]queueStats{
		"orders":     {Messages: 100000, Ready: 0, Unacked: 0, Memory: 48023416},
		"orders.dlq": {Messages: 0, Ready: 0, Unacked: 0, Memory: 68116},
		"fresh":      {Messages: -1, Ready: -1, Unacked: -1, Memory: 47772},
		"odd\tname":  {Messages: 3, Ready: 1, Unacked: 2, Memory: 9000},
	}
	if len(got) != len(want) {
		t.Errorf("parsed %d queues, want %d: %+v", len(got), len(want), got)
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("%q: %+v (found %v), want %+v", name, g, ok, w)
		}
	}
	if sum := sumMemory(got, []string{"orders", "orders.dlq"}); sum != 48023416+68116 {
		t.Errorf("sumMemory = %d, want %d", sum, 48023416+68116)
	}
	if sum := sumMemory(got, []string{"orders", "orders.retry.1m"}); sum != -1 {
		t.Errorf("sumMemory with a queue missing = %d, want -1", sum)
	}
	if sum := sumMemory(map[string]queueStats{"q": {Memory: -1}}, []string{"q"}); sum != -1 {
		t.Errorf("sumMemory with an unknown memory = %d, want -1", sum)
	}
}

func TestParseVmRSS(t *testing.T) {
	status := "Name:\tbeam.smp\nVmPeak:\t 4194304 kB\nVmRSS:\t  361020 kB\nRssAnon:\t  300000 kB\n"
	if got, ok := parseVmRSS(status); !ok || got != 361020*1024 {
		t.Errorf("parseVmRSS = %d, %v; want %d", got, ok, 361020*1024)
	}
	for _, bad := range []string{"", "Name:\tkthreadd\n", "VmRSS:\t12 MB\n", "VmRSS:\tlots kB\n", "VmRSS:\t-5 kB\n"} {
		if got, ok := parseVmRSS(bad); ok {
			t.Errorf("parseVmRSS(%q) = %d, true; want false", bad, got)
		}
	}
	if processRSS(0) != -1 {
		t.Error("processRSS(0) claims to know")
	}
}

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
	skip, err := parseSkip("retry-memory, delayed,raw-delayed,tiers,raw-tiers,local-retry,retry")
	if err != nil {
		t.Fatal(err)
	}
	if len(skip) != 7 {
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

func TestBytesText(t *testing.T) {
	for n, want := range map[int64]string{-1: "–", 0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 48023416: "45.8 MiB", 3 << 30: "3.00 GiB"} {
		if got := bytesText(n); got != want {
			t.Errorf("bytesText(%d) = %q, want %q", n, got, want)
		}
	}
	for _, tt := range []struct {
		before, after int64
		want          string
	}{{1000, 201000, "2 B"}, {-1, 5, "–"}, {5, -1, "–"}, {300, 100, "0 B"}, {300000, 100000, "-2 B"}} {
		if got := perMessage(tt.before, tt.after, 100000); got != tt.want {
			t.Errorf("perMessage(%d, %d) = %q, want %q", tt.before, tt.after, got, tt.want)
		}
	}
}

// The default -retry-ctl reaches the 4.3 node and listQueues reads what it
// prints: a queue declared on the node shows up with its memory. Skipped
// where the node or its rabbitmqctl (root only) is not at hand, and under
// make test in the suites of other brokers: their lanes run beside the 4.3
// one, which restarts its broker.
func TestRabbitmqctlListsQueueMemory(t *testing.T) {
	if u := os.Getenv("AMQP_URL"); u != "" && u != defaultRetryURL {
		t.Skipf("the suite's broker is %s: make test runs this in the 4.3 suite, whose broker it is", redact(u))
	}
	ctl := strings.Fields(defaultRetryCtl)
	b, err := dialBroker(defaultRetryURL)
	if err != nil {
		t.Skipf("no RabbitMQ 4.3: %v", err)
	}
	defer b.Close()
	q := uniqueName("ctl")
	cleanup, err := declareTopology(b, dlx.Topology{Queue: q, Type: dlx.Quorum})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cleanup(); err != nil {
			t.Error(err)
		}
	}()
	ctx := context.Background()
	queues, err := listQueues(ctx, ctl)
	if err != nil {
		t.Skipf("%s does not answer here: %v", defaultRetryCtl, err)
	}
	if s, ok := queues[q]; !ok || s.Memory <= 0 {
		t.Errorf("%s list_queues: %q is %+v (listed: %v), want its memory", defaultRetryCtl, q, s, ok)
	}
	if n, err := nodeMemory(ctx, ctl); err != nil || n < 1<<20 {
		t.Errorf("nodeMemory = %d, %v; want the node's bytes", n, err)
	}
}
