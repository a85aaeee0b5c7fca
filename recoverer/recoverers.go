package recoverer

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
)

// ErrRequeueRequested is what Requeue returns.
var ErrRequeueRequested error = requeueRequested{}

// requeueRequested is ErrRequeueRequested: a recovery that did not fail to
// put the message somewhere but asks, on purpose, for it to stay on its
// queue as a failure. Its RequeuesOnPurpose method tells the listener to
// requeue it with a reject, which counts toward a quorum queue's delivery
// limit, rather than the nack of a recovery that failed.
type requeueRequested struct{}

func (requeueRequested) Error() string           { return "recoverer: requeue requested" }
func (requeueRequested) RequeuesOnPurpose() bool { return true }

// Reject returns a Recoverer that has the listener reject the message without
// requeue, so that the queue's own dead-letter exchange (x-dead-letter-exchange)
// takes it, atomically, in the broker. A queue without one drops the message:
// use Reject only on queues that have one.
func Reject() middleware.Recoverer { return rejecter{} }

// errRejected is Reject's answer, made once: on a queue that dead-letters
// every failure through its own exchange, each failure asks for it.
var errRejected = fmt.Errorf("recoverer: Reject: %w", middleware.ErrReject)

// rejecter is Reject's Recoverer. It answers at once, with no I/O and no
// wait (RecoversAtOnce), so the listener's reader goes on with the delivery
// rather than handing its reading to another goroutine first, as it does
// before a recovery that may wait out an outage.
type rejecter struct{}

func (rejecter) Recover(context.Context, *amqp.Delivery, error) error { return errRejected }
func (rejecter) RecoversAtOnce(*amqp.Delivery, error) bool            { return true }

// Requeue returns a Recoverer that leaves the message on its queue, even when
// its error is Permanent: the listener requeues it (after a delay, so it does
// not spin). Use it last in a Fallback, for messages that must never leave
// their queue unseen.
func Requeue() middleware.Recoverer { return requeuer{} }

// requeuer is Requeue's Recoverer, which answers at once as rejecter does.
type requeuer struct{}

func (requeuer) Recover(context.Context, *amqp.Delivery, error) error { return ErrRequeueRequested }
func (requeuer) RecoversAtOnce(*amqp.Delivery, error) bool            { return true }

// Fallback returns a Recoverer that tries recoverers in order until one
// succeeds, or one asks for a rejection (Reject), and otherwise returns all
// their errors joined. It stops when the context ends. It panics if given no
// recoverer or a nil one.
//
//	recoverer.Fallback(recoverer.Republish(pub, "orders.dlx", "orders"), recoverer.Reject())
func Fallback(rs ...middleware.Recoverer) middleware.Recoverer {
	if len(rs) == 0 {
		panic("recoverer: Fallback expects at least one Recoverer")
	}
	for i, r := range rs {
		if r == nil {
			panic(fmt.Sprintf("recoverer: Fallback expects non-nil recoverers, got nil at index %d", i))
		}
	}
	rs = append([]middleware.Recoverer(nil), rs...)
	return middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
		var errs []error
		for _, r := range rs {
			err := r.Recover(ctx, d, cause)
			if err == nil || errors.Is(err, middleware.ErrReject) {
				return err
			}
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
		return errors.Join(errs...)
	})
}
