package listener

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
)

var (
	// ErrQueueNotFound: the queue does not exist (with WithMissingQueueFatal).
	ErrQueueNotFound = errors.New("listener: queue not found")

	// ErrAlreadyRunning: Run was called a second time.
	ErrAlreadyRunning = errors.New("listener: Run called more than once")

	// ErrRedeliveryLimit: a delivery had been delivered WithRedeliveryLimit
	// times before without being settled, so the listener handed it to the
	// chain's recoverer (or rejected it) without running the handler. See
	// RedeliveryLimitError.
	ErrRedeliveryLimit = errors.New("listener: redelivery limit reached")

	// ErrConsumeRefused: the broker refused basic.consume in a way no retry
	// can heal (a precondition, permissions, a queue locked by another
	// connection), so Run ends. See ConsumeRefusedError.
	ErrConsumeRefused = errors.New("listener: the broker refused to consume")

	// ErrLoginRefused: the broker refused the login, so Run ends: a wrong
	// user name or password (403 ACCESS_REFUSED), or a user without
	// permission on the virtual host, or a virtual host that does not exist
	// (530 NOT_ALLOWED). A connection limit reached (530 too) is not a
	// refused login: it is redialled. See LoginRefusedError.
	ErrLoginRefused = errors.New("listener: the broker refused the login")
)

// LoginRefusedError ends Run (a Listener's or a Group's) when the broker
// refuses the login in a way no redial can change. It matches
// ErrLoginRefused and unwraps to the broker's *amqp.Error (403 or 530).
type LoginRefusedError struct {
	Who string // "listener" or "listener group"
	URL string // the address that refused, password hidden
	Err *amqp.Error
}

func (e *LoginRefusedError) Error() string {
	return fmt.Sprintf("%s: the broker at %s refused the login (%d %s): %s", e.Who, e.URL, e.Err.Code, e.Err.Reason, amqpconn.LoginFix(e.URL, e.Err))
}

func (e *LoginRefusedError) Unwrap() error        { return e.Err }
func (e *LoginRefusedError) Is(target error) bool { return target == ErrLoginRefused }

// ConsumeRefusedError ends Run when the broker refuses to let the listener
// consume: 406 PRECONDITION_FAILED (a consumer argument the queue's type does
// not take: x-consumer-timeout on a RabbitMQ 4.3 classic queue), 403
// ACCESS_REFUSED (no read permission on the queue, or another consumer holds
// it exclusively), 405 RESOURCE_LOCKED (an exclusive queue of another
// connection). It matches ErrConsumeRefused and unwraps to the broker's
// *amqp.Error.
type ConsumeRefusedError struct {
	Queue string
	Err   *amqp.Error
	Fix   string // what to change, when the listener can tell
}

func (e *ConsumeRefusedError) Error() string {
	fix := e.Fix
	if fix == "" {
		fix = "retrying cannot change that: fix the queue, the consumer options or the user's permissions"
	}
	return fmt.Sprintf("listener: the broker refused to consume from queue %q (%d %s): %s", e.Queue, e.Err.Code, e.Err.Reason, fix)
}

func (e *ConsumeRefusedError) Unwrap() error        { return e.Err }
func (e *ConsumeRefusedError) Is(target error) bool { return target == ErrConsumeRefused }

// RedeliveryLimitError is the error a delivery past WithRedeliveryLimit is
// recovered (or rejected) with. It matches ErrRedeliveryLimit; recoverers
// write it as the fault (recoverer.Republish: x-exception-message, the
// error type *listener.RedeliveryLimitError, and Deliveries as the attempts).
type RedeliveryLimitError struct {
	// Deliveries is the broker's x-delivery-count: how often the message was
	// delivered before and not settled (a process that died while handling
	// it, a lost connection, a requeue after a failure).
	Deliveries int
	Limit      int // WithRedeliveryLimit's n
}

func (e *RedeliveryLimitError) Error() string {
	return fmt.Sprintf("listener: redelivery limit reached: delivered %d time%s before without being settled (limit %d), "+
		"so the handler did not run again: it may crash the process (x-delivery-count counts every delivery that was "+
		"not acked or rejected for good)", e.Deliveries, plural(e.Deliveries), e.Limit)
}

func (e *RedeliveryLimitError) Is(target error) bool { return target == ErrRedeliveryLimit }

// AttemptsMade reports the deliveries, for recoverers that write the attempt
// count (chainrun.AttemptsMade).
func (e *RedeliveryLimitError) AttemptsMade() int { return e.Deliveries }

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
