package chainctx

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// SurveyWait builds a chain by calling build, and returns the longest time
// the Retries built meanwhile may keep one delivery waiting between attempts,
// handler time not included. The listener compares it with the broker's
// consumer_timeout.
//
// Nothing of the chain runs: building a middleware is calling it with the
// handler it wraps, and a Retry being built reports its policy (RetryBuilt).
// So a middleware that copies the delivery, reads its headers or has side
// effects is never called on a message that does not exist, and Retries below
// a middleware that calls next conditionally are counted all the same.
//
// Builders run inside out: Chain(a, b)(h) builds b before a. A Retry being
// built therefore wraps whatever the survey has seen and not yet attributed
// to an enclosing Retry; it may wait its own worst case plus, on every
// attempt, theirs. Retries a middleware builds side by side (one branch or
// the other) count as if nested: the estimate is never short.
//
// One survey runs at a time. A Retry that another goroutine happens to build
// during it is counted too, which can only make the estimate longer.
func SurveyWait(build func()) time.Duration {
	surveying.Lock()
	defer surveying.Unlock()
	s := &survey{}
	current.Store(s)
	defer current.Store(nil)
	build()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unclaimed
}

// RetryBuilt is called by a Retry as it wraps its next handler: worst is the
// longest it may wait between its own attempts and attempts the most it makes.
// Outside a survey it costs one atomic load.
func RetryBuilt(worst time.Duration, attempts int) {
	s := current.Load()
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unclaimed = addSaturating(worst, mulSaturating(s.unclaimed, attempts))
}

var (
	surveying sync.Mutex
	current   atomic.Pointer[survey]
)

type survey struct {
	mu sync.Mutex
	// unclaimed is the worst case of what has been built and is not yet
	// wrapped by a Retry.
	unclaimed time.Duration
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
