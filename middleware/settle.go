package middleware

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Settlement is what happens to a delivery once its chain has returned.
type Settlement uint8

const (
	// Ack: the message was handled, or is confirmed somewhere else.
	Ack Settlement = iota + 1
	// Reject: basic.reject without requeue; the queue's own dead-letter
	// exchange gets the message if it has one, otherwise the broker drops it.
	Reject
	// Requeue: basic.reject with requeue; the message goes back to its queue.
	Requeue
)

func (s Settlement) String() string {
	switch s {
	case Ack:
		return "ack"
	case Reject:
		return "reject"
	case Requeue:
		return "requeue"
	}
	return fmt.Sprintf("Settlement(%d)", uint8(s))
}

// SettlementFor maps a chain's final error to its settlement: nil acks;
// interruptions and failed recoveries requeue (the message is not safe
// anywhere else); a recoverer's ErrReject and Permanent errors are rejected
// without requeue; every other error requeues. The order matters: a failed
// recovery still requeues whatever the handler's error wraps, since
// rejecting it could drop the only copy.
func SettlementFor(err error) Settlement {
	switch {
	case err == nil:
		return Ack
	case errors.Is(err, ErrInterrupted), errors.Is(err, ErrRecoveryFailed):
		return Requeue
	case errors.Is(err, ErrReject):
		return Reject
	case IsPermanent(err):
		return Reject
	default:
		return Requeue
	}
}

// Settle acks or rejects d, one delivery at a time (multiple=false), as
// SettlementFor(err) says. The listener settles every delivery this way; Settle
// is exported for programs that run a chain on their own amqp091 consumer.
func Settle(d *amqp.Delivery, err error) (Settlement, error) {
	s := SettlementFor(err)
	var serr error
	switch s {
	case Ack:
		serr = d.Ack(false)
	case Reject:
		serr = d.Reject(false)
	default:
		serr = d.Reject(true)
	}
	if serr != nil {
		return s, fmt.Errorf("middleware: %s of delivery %d failed: %w", s, d.DeliveryTag, serr)
	}
	return s, nil
}
