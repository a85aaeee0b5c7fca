package middleware

import (
	"math"
	"time"
)

// worstCaseWait is the sum of the delays Retry may wait, at their largest:
// interval i is f(i) = min(initial·multiplier^i, max) as backoff/v4 computes
// it, waited as up to f(i)·(1+jitter). With HandOffAfter(T), a wait happens
// only while its smallest draw f(i)·(1-jitter) is within T, and lasts at
// most T. Closed form throughout, so that huge or flat policies cost nothing.
func (p *retryPolicy) worstCaseWait() time.Duration {
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
func (p *retryPolicy) sumIntervals(n float64) float64 {
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
func (p *retryPolicy) firstAtCap() float64 {
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
func (p *retryPolicy) firstAbove(x float64) float64 {
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
