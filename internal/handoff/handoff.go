package handoff

import "sync"

// Queue is an unbounded first-in, first-out queue with one taker. The zero
// value is not usable; make one with New.
type Queue[T any] struct {
	mu     sync.Mutex
	items  []T
	closed bool
	wake   chan struct{} // something to take, or closed, after being empty
}

// New returns an empty, open Queue.
func New[T any]() *Queue[T] {
	return &Queue[T]{wake: make(chan struct{}, 1)}
}

// Put adds v at the end. It never waits. Putting after Close is a bug of
// the caller's: the value may never be taken.
func (q *Queue[T]) Put(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	first := len(q.items) == 1
	q.mu.Unlock()
	if first {
		q.signal()
	}
}

// Close says nothing more will be put: Take returns what is left, then
// nothing.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

func (q *Queue[T]) signal() {
	select {
	case q.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// Take appends up to max values to into, in the order they were put,
// waiting for one if the queue is empty; it returns none only once the
// queue is closed and empty. One goroutine takes.
func (q *Queue[T]) Take(into []T, max int) []T {
	for {
		q.mu.Lock()
		n := min(len(q.items), max)
		into = append(into, q.items[:n]...)
		rest := copy(q.items, q.items[n:])
		clear(q.items[rest:]) // let go of what was taken
		q.items = q.items[:rest]
		closed := q.closed
		q.mu.Unlock()
		if n > 0 || closed {
			return into
		}
		<-q.wake
	}
}
