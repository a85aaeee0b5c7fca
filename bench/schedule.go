package main

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// scheduleAttempts is Retry's maxAttempts in the schedule test: 5 attempts,
// 4 waits of 1s, 2s, 4s, 8s with the default backoff.
const scheduleAttempts = 5

// Schedule is how closely the waits between attempts followed the backoff.
type Schedule struct {
	Gaps []Gap `json:"gaps"`
}

// Gap is one wait: the time between the start of attempt After and the next.
type Gap struct {
	After       int     `json:"after_attempt"`
	ExpectedMS  float64 `json:"expected_ms"`
	ActualMS    float64 `json:"actual_ms"`
	DeviationMS float64 `json:"deviation_ms"`
}

// expectedWaits is the default policy's waits: initial, ×multiplier, capped.
func expectedWaits(n int) []time.Duration {
	waits := make([]time.Duration, n)
	w := float64(middleware.DefaultInitialInterval)
	for i := range waits {
		waits[i] = time.Duration(math.Min(w, float64(middleware.DefaultMaxInterval)))
		w *= middleware.DefaultMultiplier
	}
	return waits
}

// measureSchedule sends one always-failing message through the listener's
// usual chain, in real time, and times the attempts as the handler sees
// them: what a user's handler would observe, scheduling latency included.
func measureSchedule(ctx context.Context, e *env) (res *Schedule, err error) {
	q := uniqueName("schedule")
	dlq := q + ".dlq"
	pub, done, err := e.withRecovery(q, dlq)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, done()) }()
	if err := e.broker.fill(ctx, q, 1); err != nil {
		return nil, err
	}

	var (
		mu       sync.Mutex
		attempts []time.Time
	)
	// The message reaching the DLQ ends the test, after 15s of waits with
	// nothing to count.
	recovered := newTally(1)
	recovered.stall = 40 * time.Second
	republish := recoverer.Republish(pub, "", dlq)
	rec := middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
		err := republish.Recover(ctx, d, cause)
		if err == nil {
			recovered.hit()
		}
		return err
	})
	handle := func(context.Context, *amqp.Delivery) error {
		mu.Lock()
		attempts = append(attempts, time.Now())
		mu.Unlock()
		return errPoison
	}
	stop, err := startListener(ctx, e, q, middleware.Chain(middleware.Retry(scheduleAttempts), middleware.Recover(rec)), handle)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	if err := recovered.wait(ctx); err != nil {
		return nil, err
	}

	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != scheduleAttempts {
		return nil, errors.New("the message was not attempted exactly 5 times")
	}
	res = &Schedule{}
	for i, want := range expectedWaits(scheduleAttempts - 1) {
		got := attempts[i+1].Sub(attempts[i])
		res.Gaps = append(res.Gaps, Gap{
			After:       i + 1,
			ExpectedMS:  ms(want),
			ActualMS:    ms(got),
			DeviationMS: ms(got - want),
		})
	}
	return res, nil
}

// ms is d in milliseconds, with fractions.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
