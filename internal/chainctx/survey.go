package chainctx

import (
	"bytes"
	"math"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Survey is what building a chain told about it.
type Survey struct {
	// Wait is the longest time the Retries built may keep one delivery
	// waiting between attempts, plus the handler time a Timeout bounds:
	// handler time without a Timeout is not included. The listener
	// compares it with the broker's consumer_timeout.
	Wait time.Duration
	// Recoverer is the Recoverer of the Recover nearest the handler (the
	// first built), or nil: the one a Permanent error of the handler
	// reaches. The listener hands it deliveries past their redelivery
	// limit without running the chain.
	Recoverer any
	// TimeoutAroundRecover is the d of a Timeout built around a Recover,
	// or 0: past its deadline the recoverer cannot run, so the delivery
	// would be requeued and run again for ever. The listener refuses it.
	TimeoutAroundRecover time.Duration
	// Retries: a Retry was built, so the chain can exhaust its retries;
	// without a Recover the message then goes back to its queue, and comes
	// back to fail again, for ever.
	Retries bool
}

// SurveyChain builds a chain by calling build, and returns what the Retries
// and Recovers built meanwhile reported.
//
// Nothing of the chain runs: building a middleware is calling it with the
// handler it wraps, and a Retry or Recover being built reports itself
// (RetryBuilt, RecovererBuilt). So a middleware that copies the delivery,
// reads its headers or has side effects is never called on a message that
// does not exist, and Retries below a middleware that calls next
// conditionally are counted all the same. A Retry or Recover that a
// middleware builds only when a message arrives is not seen.
//
// Builders run inside out: Chain(a, b)(h) builds b before a. A Retry being
// built therefore wraps whatever the survey has seen and not yet attributed
// to an enclosing Retry; it may wait its own worst case plus, on every
// attempt, theirs. Retries a middleware builds side by side (one branch or
// the other) count as if nested: the estimate is never short. For the same
// reason the first Recover built is the innermost.
//
// A survey counts only what is built on the goroutine that runs it, so
// chains built elsewhere at the same time (other listeners starting
// consumers, a test in parallel) do not leak into it; surveys may nest.
func SurveyChain(build func()) Survey {
	id := goroutineID()
	s := &survey{}
	outer, nested := surveys.Load(id)
	surveys.Store(id, s)
	running.Add(1)
	defer func() {
		running.Add(-1)
		if nested {
			surveys.Store(id, outer)
		} else {
			surveys.Delete(id)
		}
	}()
	build()
	return Survey{Wait: s.unclaimed, Recoverer: s.recoverer, TimeoutAroundRecover: s.timeoutAroundRecover, Retries: s.retries}
}

// SurveyWait is SurveyChain(build).Wait.
func SurveyWait(build func()) time.Duration { return SurveyChain(build).Wait }

// RetryBuilt is called by a Retry as it wraps its next handler: worst is the
// longest it may wait between its own attempts and attempts the most it makes.
// When no survey runs anywhere it costs one atomic load.
func RetryBuilt(worst time.Duration, attempts int) {
	s := current()
	if s == nil {
		return
	}
	s.unclaimed = addSaturating(worst, mulSaturating(s.unclaimed, attempts))
	s.retries = true
}

// TimeoutBuilt is called by a Timeout as it wraps its next handler: one
// call through it lasts d at most, waits and handler time together (a
// handler that ignores its deadline is reported and failed, and New
// cannot count past it). From here on the survey counts handler time too.
func TimeoutBuilt(d time.Duration) {
	if s := current(); s != nil {
		s.unclaimed = d
		if s.recoverer != nil && s.timeoutAroundRecover == 0 {
			s.timeoutAroundRecover = d // a Recover was built before: this Timeout wraps it
		}
	}
}

// RecovererBuilt is called by a Recover as it wraps its next handler, with
// its Recoverer. When no survey runs anywhere it costs one atomic load.
func RecovererBuilt(r any) {
	if s := current(); s != nil && s.recoverer == nil {
		s.recoverer = r
	}
}

// current is the survey running on this goroutine, or nil.
func current() *survey {
	if running.Load() == 0 {
		return nil
	}
	v, ok := surveys.Load(goroutineID())
	if !ok {
		return nil
	}
	return v.(*survey)
}

var (
	running atomic.Int32 // surveys in progress, on any goroutine
	surveys sync.Map     // goroutine id → its *survey
)

// survey is used by one goroutine only, the one that runs it.
type survey struct {
	// unclaimed is the worst case of what has been built and is not yet
	// wrapped by a Retry.
	unclaimed            time.Duration
	recoverer            any           // the first Recover's
	timeoutAroundRecover time.Duration // the first Timeout built after a Recover
	retries              bool          // a Retry was built
}

// goroutineID is the number the runtime prints for the current goroutine in
// a stack trace. Go keeps it out of its API on purpose; it serves here only
// to tell the surveying goroutine's builds from every other's, while a
// survey runs, which is when listener.New checks a chain.
func goroutineID() uint64 {
	var buf [64]byte
	line := buf[:runtime.Stack(buf[:], false)] // "goroutine 18 [running]:\n..."
	line = bytes.TrimPrefix(line, []byte("goroutine "))
	if i := bytes.IndexByte(line, ' '); i > 0 {
		if id, err := strconv.ParseUint(string(line[:i]), 10, 64); err == nil {
			return id
		}
	}
	return 0
}

func addSaturating(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func mulSaturating(d time.Duration, n int) time.Duration {
	if d == 0 || n == 0 {
		return 0
	}
	if d > math.MaxInt64/time.Duration(n) {
		return math.MaxInt64
	}
	return d * time.Duration(n)
}
