package listener

import (
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The broker sends a channel up to its prefetch of deliveries ahead of its
// handlers. amqp091-go keeps those it has read from the socket in a buffer
// of its own that nobody can count, so the listener would not know what it
// holds from the broker: Stats would show the few deliveries taken in while
// the broker counts the whole prefetch unacknowledged, and a message that
// waited 30 s behind a busy handler would look 30 s younger than it is.
//
// So each channel has a read-ahead goroutine that takes every delivery from
// amqp091-go as it comes, stamps when it came, and queues it for the
// channel's reader (readAhead): Stats counts that queue (Prefetched), and a
// delivery's age (OldestInFlight, the consumer-timeout watch) runs from its
// arrival. It is one more hand-off per delivery, paid for in CPU on the
// goroutine that amqp091-go's buffer would have kept busy anyway.

// readAhead is a channel's deliveries that arrived and were not taken in
// yet, oldest first. The read-ahead goroutine pushes; the channel's reader
// (one goroutine at a time) takes; Stats looks.
type readAhead struct {
	mu     sync.Mutex
	q      []aheadDelivery // from head
	head   int
	closed bool // the deliveries channel has closed: nothing more comes

	// ready is told (without blocking: it holds one) when the queue goes
	// from empty to not and when it closes; a reader finding the queue
	// empty waits on it.
	ready chan struct{}
}

type aheadDelivery struct {
	d  amqp.Delivery
	at int64 // monotime when it arrived
}

func newReadAhead() readAhead { return readAhead{ready: make(chan struct{}, 1)} }

// readAheadFrom is the channel's read-ahead goroutine: it ends when
// amqp091-go closes the deliveries channel (the channel closed or the
// consumer was cancelled), which is also what ends the reader.
func (c *consumer) readAheadFrom(deliveries <-chan amqp.Delivery) {
	defer c.sv.consumers.Done()
	r := &c.ahead
	for d := range deliveries {
		at := monotime()
		r.mu.Lock()
		r.q = append(r.q, aheadDelivery{d: d, at: at})
		first := len(r.q)-r.head == 1
		r.mu.Unlock()
		if first {
			r.tell()
		}
	}
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.tell()
}

func (r *readAhead) tell() {
	select {
	case r.ready <- struct{}{}:
	default: // told already
	}
}

// take returns the oldest delivery that arrived, without waiting: ok is
// false when there is none, and closed then says whether one may still come.
func (r *readAhead) take() (d amqp.Delivery, at int64, ok, closed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.head == len(r.q) {
		return d, 0, false, r.closed
	}
	e := &r.q[r.head]
	d, at = e.d, e.at
	*e = aheadDelivery{} // the queue keeps no reference to its body
	r.head++
	switch {
	case r.head == len(r.q):
		r.q, r.head = r.q[:0], 0
	case r.head >= 256 && r.head*2 >= len(r.q):
		// A reader that never quite catches up: the queue never empties,
		// so move what is left to the front rather than grow for ever.
		n := copy(r.q, r.q[r.head:])
		clear(r.q[n:])
		r.q, r.head = r.q[:n], 0
	}
	return d, at, true, false
}

// next returns the channel's next delivery and when it arrived, waiting for
// one; ok is false once the deliveries channel has closed and every
// delivery that arrived has been taken.
func (c *consumer) next() (d amqp.Delivery, at int64, ok bool) {
	r := &c.ahead
	for {
		d, at, ok, closed := r.take()
		if ok || closed {
			return d, at, ok
		}
		// Bounded: the read-ahead goroutine tells at the next arrival, and
		// at the close that every end of the channel or consumer brings.
		<-r.ready
	}
}

// aheadStats returns how many deliveries arrived and were not taken in yet,
// and when the oldest of them arrived (0 for none).
func (r *readAhead) aheadStats() (n int, oldest int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n = len(r.q) - r.head; n > 0 {
		oldest = r.q[r.head].at
	}
	return n, oldest
}
