package middleware

import (
	"math"
	"time"
)

// worstCaseWait is the longest Retry may keep one delivery waiting between
// attempts. Without rules it is its schedule's. With rules, a delivery makes
// at most mostAttempts attempts, and each wait follows the schedule of the
// error before it, advanced by that schedule's failures only: so the waits
// of each schedule are a prefix of its own, and together they are at most
// the sum of every schedule's worst case, and at most mostAttempts-1 of the
// longest single wait.
func (p *retryPolicy) worstCaseWait() time.Duration {
	if len(p.rules) == 0 {
		return p.schedule.worstCaseWait()
	}
	sum, longest := p.schedule.worstCaseWait(), p.schedule.longestWait()
	for i := range p.rules {
		sum = addSaturating(sum, p.rules[i].worstCaseWait())
		longest = max(longest, p.rules[i].longestWait())
	}
	return min(sum, durationFromFloat(float64(p.mostAttempts-1)*float64(longest)))
}

// longestWait is the longest single wait of the schedule (0 when it never
// waits).
func (s *schedule) longestWait() time.Duration {
	if s.maxAttempts < 2 {
		return 0
	}
	longest := durationFromFloat(float64(s.maxInterval) * (1 + s.jitter))
	if s.handOffSet {
		longest = min(longest, s.handOff)
	}
	if s.maxElapsed > 0 {
		longest = min(longest, s.maxElapsed)
	}
	return longest
}

func addSaturating(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// worstCaseWait is the sum of the delays the schedule may wait, at their
// largest: interval i is f(i) = min(initial·multiplier^i, max) as backoff/v4
// computes it, waited as up to f(i)·(1+jitter). With HandOffAfter(T), a wait
// happens only while its smallest draw f(i)·(1-jitter) is within T, and
// lasts at most T. Closed form throughout, so that huge or flat policies
// cost nothing.
func (p *schedule) worstCaseWait() time.Duration {
	waits := float64(p.maxAttempts - 1)
	upper := 1 + p.jitter
	var sum float64
	if !p.handOffSet {
		sum = p.sumIntervals(waits) * upper
	} else {
		T := float64(p.handOff)
		happen := math.Min(waits, p.firstAbove(T/(1-p.jitter)))
		full := math.Min(happen, p.firstAbove(T/upper)) // these fit under T even at their largest
		sum = p.sumIntervals(full)*upper + (happen-full)*T
	}
	total := durationFromFloat(sum)
	if p.maxElapsed > 0 && total > p.maxElapsed {
		total = p.maxElapsed
	}
	return total
}

// sumIntervals is f(0) + ... + f(n-1).
func (p *schedule) sumIntervals(n float64) float64 {
	initial, capped, m := float64(p.initial), float64(p.maxInterval), p.multiplier
	growing := math.Min(n, p.firstAtCap())
	var sum float64
	if m == 1 {
		sum = growing * initial
	} else {
		sum = initial * (math.Pow(m, growing) - 1) / (m - 1)
	}
	return sum + (n-growing)*capped
}

// firstAtCap is the first i whose interval is the cap.
func (p *schedule) firstAtCap() float64 {
	initial, capped, m := float64(p.initial), float64(p.maxInterval), p.multiplier
	switch {
	case initial >= capped:
		return 0
	case m == 1:
		return math.Inf(1)
	}
	return math.Ceil(math.Log(capped/initial) / math.Log(m))
}

// firstAbove is the first i with f(i) > x (+Inf when none is).
func (p *schedule) firstAbove(x float64) float64 {
	initial, capped, m := float64(p.initial), float64(p.maxInterval), p.multiplier
	switch {
	case math.IsInf(x, 1) || x >= capped:
		return math.Inf(1)
	case initial > x:
		return 0
	case m == 1:
		return math.Inf(1)
	}
	return math.Floor(math.Log(x/initial)/math.Log(m)) + 1
}

func durationFromFloat(f float64) time.Duration {
	if f >= math.MaxInt64 || math.IsNaN(f) {
		return math.MaxInt64
	}
	return time.Duration(f)
}
