package middleware

import (
	"context"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// WorstCaseWait reports the longest time the chain mw may keep one delivery
// waiting between attempts, handler time not included: the sum of every
// Retry's delays at their largest (jitter included), bounded by
// WithMaxElapsedTime, and multiplied through nested Retries.
//
// It finds the Retries by calling the chain once over an empty delivery with a
// handler that succeeds at once; Retry and Recover recognise the probe and do
// nothing else. Other middlewares run as they would for a message handled on
// the first attempt, and one that does not call next hides the Retries below
// it.
func WorstCaseWait(mw Middleware) time.Duration {
	if mw == nil {
		return 0
	}
	pr := &probe{}
	h := mw(func(context.Context, *amqp.Delivery) error { return nil })
	_ = h(context.WithValue(context.Background(), probeKey, pr), probeDelivery)
	return pr.wait
}

// probeDelivery identifies WorstCaseWait's dry run by pointer, so the hot
// path pays a pointer comparison rather than a context lookup.
var probeDelivery = &amqp.Delivery{}

type probe struct{ wait time.Duration }

func (p *retryPolicy) runProbe(ctx context.Context, pr *probe, d *amqp.Delivery, next Handler) error {
	inner := &probe{}
	err := next(context.WithValue(ctx, probeKey, inner), d)
	// Every attempt may spend the inner chain's worst case waiting as well.
	pr.wait = addSaturating(pr.wait, addSaturating(p.worstCaseWait(), mulSaturating(inner.wait, p.maxAttempts)))
	return err
}

// worstCaseWait is the sum of the maxAttempts-1 delays at their largest:
// delay i is min(initial·multiplier^i, max)·(1+jitter), as backoff/v4 computes
// it. Closed form, so that Retry(math.MaxInt, WithMultiplier(1)) costs nothing.
func (p *retryPolicy) worstCaseWait() time.Duration {
	waits := float64(p.maxAttempts - 1)
	initial, capped, m := float64(p.initial), float64(p.maxInterval), p.multiplier
	// How many delays come before the cap.
	growing := waits
	if m > 1 && initial < capped {
		growing = math.Min(waits, math.Ceil(math.Log(capped/initial)/math.Log(m)))
	} else if initial >= capped {
		growing = 0
	}
	var sum float64
	if m == 1 {
		sum = growing * initial
	} else {
		sum = initial * (math.Pow(m, growing) - 1) / (m - 1)
	}
	sum += (waits - growing) * capped
	total := durationFromFloat(sum * (1 + p.jitter))
	if p.maxElapsed > 0 && total > p.maxElapsed {
		total = p.maxElapsed
	}
	return total
}

func durationFromFloat(f float64) time.Duration {
	if f >= math.MaxInt64 || math.IsNaN(f) {
		return math.MaxInt64
	}
	return time.Duration(f)
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
