package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// epoch anchors tally's timestamps: durations since it keep Go's monotonic
// clock, which wall-clock nanoseconds would lose.
var epoch = time.Now()

// tally counts messages as the code under test finishes them and remembers
// when the first began and the last ended. It is safe for many goroutines.
type tally struct {
	target int64
	n      atomic.Int64
	first  atomic.Int64 // time.Duration since epoch, 0 until begin
	last   atomic.Int64
	done   chan struct{}
	stall  time.Duration // how long wait lets the count stand still
}

func newTally(target int) *tally {
	return &tally{target: int64(target), done: make(chan struct{}), stall: stallTimeout}
}

// begin marks the first message handled; later calls do nothing.
func (t *tally) begin() {
	t.first.CompareAndSwap(0, int64(time.Since(epoch)))
}

// hit counts one finished message and closes done on the target.
func (t *tally) hit() {
	now := int64(time.Since(epoch))
	t.first.CompareAndSwap(0, now)
	if t.n.Add(1) == t.target {
		t.last.Store(now)
		close(t.done)
	}
}

// hitN counts n finished messages at once (a batch).
func (t *tally) hitN(n int) {
	now := int64(time.Since(epoch))
	t.first.CompareAndSwap(0, now)
	if total := t.n.Add(int64(n)); total >= t.target && total-int64(n) < t.target {
		t.last.Store(now)
		close(t.done)
	}
}

// count is how many messages have been counted so far.
func (t *tally) count() int { return int(t.n.Load()) }

// elapsed is the time from the first message begun to the target reached.
func (t *tally) elapsed() time.Duration { return time.Duration(t.last.Load() - t.first.Load()) }

// stallTimeout is how long wait lets the count stand still by default before
// it gives up: a variant that stops making progress is a failure, not a slow
// run.
const stallTimeout = 20 * time.Second

// wait blocks until the target is reached, ctx ends, or the count stalls.
func (t *tally) wait(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	seen, since := -1, time.Now()
	for {
		select {
		case <-t.done:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%d of %d messages: %w", t.count(), t.target, ctx.Err())
		case now := <-tick.C:
			if c := t.count(); c != seen {
				seen, since = c, now
			} else if now.Sub(since) > t.stall {
				return fmt.Errorf("stalled at %d of %d messages for %v", c, t.target, t.stall)
			}
		}
	}
}

// cpuTime is this process's user+system CPU time so far. The broker shares
// the machine's cores, so throughput moves with whatever else runs; CPU per
// message is the client's own cost and moves much less.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Sample is one measured run of one variant.
type Sample struct {
	Messages  int     `json:"messages"`
	Seconds   float64 `json:"seconds"` // first message begun to last finished
	MsgPerSec float64 `json:"msg_per_sec"`
	CPUPerMsg float64 `json:"cpu_us_per_msg"` // client CPU (user+system), µs
	// BrokerCPUPerMsg is the broker's CPU over the same span, per message, µs:
	// 0 when the broker is not a process of this machine the bench can see.
	// It includes whatever else the broker did meanwhile.
	BrokerCPUPerMsg float64 `json:"broker_cpu_us_per_msg,omitempty"`
}

// sampleOf turns a finished tally and the CPU spent since cpu0 into a Sample.
func sampleOf(t *tally, cpu0 cpuMark) Sample {
	n := int(t.target)
	secs := t.elapsed().Seconds()
	s := Sample{
		Messages:  n,
		Seconds:   secs,
		MsgPerSec: float64(n) / secs,
		CPUPerMsg: float64((cpuTime() - cpu0.self).Nanoseconds()) / 1e3 / float64(n),
	}
	if b, ok := cpu0.brokerCPUSince(); ok {
		s.BrokerCPUPerMsg = float64(b.Nanoseconds()) / 1e3 / float64(n)
	}
	return s
}

// median of xs; the mean of the middle two for an even count, 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 0 {
		return (s[m-1] + s[m]) / 2
	}
	return s[m]
}

// gauge counts the handlers running at once, entered at a handler's start
// and left at its end. The broker's consumer count no longer says this: a
// listener's channels share a pool of handler slots, so the broker sees the
// channels (two for eight handlers) while the handlers are what a slow job
// waits for. It is safe for many goroutines.
type gauge struct {
	target  int64        // the count whose first arrival is timed
	now     atomic.Int64 // handlers running
	peak    atomic.Int64 // the most that ran at once
	reached atomic.Int64 // time.Duration since epoch when now first reached target, 0 until then

	mu    sync.Mutex
	steps []gaugeStep // each rise of peak, in order
}

// gaugeStep is the moment the peak rose to Handlers.
type gaugeStep struct {
	At       time.Duration // since epoch
	Handlers int
}

func newGauge(target int) *gauge { return &gauge{target: int64(target)} }

// enter counts a handler starting, and reports whether this start is the
// one that first brought the count to target.
func (g *gauge) enter() (reachedTarget bool) {
	n := g.now.Add(1)
	if n <= g.peak.Load() {
		return false // the common case once the pool is full: no lock
	}
	at := time.Since(epoch)
	g.mu.Lock()
	// Under the lock, so that the steps stay in order; another handler may
	// have raised the peak past n meanwhile.
	if n > g.peak.Load() {
		g.peak.Store(n)
		g.steps = append(g.steps, gaugeStep{At: at, Handlers: int(n)})
	}
	g.mu.Unlock()
	return n >= g.target && g.reached.CompareAndSwap(0, int64(at))
}

// leave counts a handler ending.
func (g *gauge) leave() { g.now.Add(-1) }

// highest is the most handlers that ran at once so far.
func (g *gauge) highest() int { return int(g.peak.Load()) }

// reachedAt is when target handlers first ran at once, since epoch; false
// if they never did.
func (g *gauge) reachedAt() (time.Duration, bool) {
	at := g.reached.Load()
	return time.Duration(at), at != 0
}

// timeline is the peak's rises so far.
func (g *gauge) timeline() []gaugeStep {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.steps)
}
