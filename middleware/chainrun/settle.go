package chainrun

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
)

// Settlement is what happens to a delivery once its chain has returned.
type Settlement uint8

const (
	// Ack: the message was handled, or is confirmed somewhere else.
	Ack Settlement = iota + 1
	// Reject: basic.reject without requeue; the queue's own dead-letter
	// exchange gets the message if it has one, otherwise the broker drops it.
	Reject
	// Requeue: basic.reject with requeue; the message failed and goes back to
	// its queue.
	Requeue
	// Release: basic.nack with requeue; the message goes back to its queue
	// through no fault of its own (shutdown, an interrupted wait). From
	// RabbitMQ 4.3 a quorum queue counts a reject toward its delivery limit
	// and a nack not, so a message is never dead-lettered or dropped for
	// having been handed back by a consumer that was stopping.
	Release
)

func (s Settlement) String() string {
	switch s {
	case Ack:
		return "ack"
	case Reject:
		return "reject"
	case Requeue:
		return "requeue"
	case Release:
		return "release"
	}
	return fmt.Sprintf("Settlement(%d)", uint8(s))
}

// SettlementFor maps a chain's final error to its settlement: nil acks;
// interruptions (middleware.ErrInterrupted: the listener stopping, a context
// it ended) release the message; failed recoveries requeue it (it is not
// safe anywhere else); a recoverer's middleware.ErrReject and Permanent
// errors are rejected without requeue; a recoverer's middleware.ErrRedeliver
// requeues; every other error requeues,
// a handler's own context.Canceled included. The order matters: an interruption is never the message's
// failure, and a failed recovery still requeues whatever the handler's error
// wraps, since rejecting it could drop the only copy.
func SettlementFor(err error) Settlement {
	if err == nil {
		return Ack
	}
	return settlementOfFailure(err)
}

// settlementOfFailure looks into err with errors.Is and errors.As, which call
// its Unwrap, Is and As methods: user code, which may panic (a typed nil
// *MyErr whose Unwrap reads a field). Such an error is a failure like any
// other: requeued.
func settlementOfFailure(err error) (s Settlement) {
	defer func() {
		if recover() != nil {
			s = Requeue
		}
	}()
	switch {
	case errors.Is(err, middleware.ErrInterrupted):
		return Release
	case errors.Is(err, middleware.ErrRecoveryFailed), errors.Is(err, middleware.ErrRedeliver):
		return Requeue
	case errors.Is(err, middleware.ErrReject):
		return Reject
	case middleware.IsPermanent(err):
		return Reject
	default:
		return Requeue
	}
}

// Settle acks, rejects or nacks d, one delivery at a time (multiple=false),
// as SettlementFor(err) says: what the listener does with every delivery,
// for a program that runs a chain on its own amqp091 consumer.
func Settle(d *amqp.Delivery, err error) (Settlement, error) {
	s := SettlementFor(err)
	var serr error
	switch s {
	case Ack:
		serr = d.Ack(false)
	case Reject:
		serr = d.Reject(false)
	case Release:
		serr = d.Nack(false, true)
	default:
		serr = d.Reject(true)
	}
	if serr != nil {
		return s, fmt.Errorf("chainrun: %s of delivery %d failed: %w", s, d.DeliveryTag, serr)
	}
	return s, nil
}
