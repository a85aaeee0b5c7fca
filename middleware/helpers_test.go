package middleware_test

import (
	"context"
	"errors"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
)

var errBoom = errors.New("boom")

// failingHandler fails the first `failures` calls with err, then succeeds.
// It records the attempt number Attempt(ctx) reported on each call.
type failingHandler struct {
	mu       sync.Mutex
	failures int
	err      error
	attempts []int
}

func (h *failingHandler) Handle(ctx context.Context, _ *amqp.Delivery) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.attempts = append(h.attempts, middleware.Attempt(ctx))
	if len(h.attempts) <= h.failures {
		return h.err
	}
	return nil
}

func (h *failingHandler) Calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.attempts)
}

// recordingRecoverer remembers what it was asked to recover and fails with err.
type recordingRecoverer struct {
	mu       sync.Mutex
	err      error
	causes   []error
	attempts []int
}

func (r *recordingRecoverer) Recover(ctx context.Context, _ *amqp.Delivery, cause error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.causes = append(r.causes, cause)
	r.attempts = append(r.attempts, middleware.Attempt(ctx))
	return r.err
}

func (r *recordingRecoverer) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.causes)
}
