package publisher

import (
	"errors"
	"fmt"
)

var (
	// ErrUnroutable: the broker returned the message (basic.return) because no
	// queue is bound to the exchange with that routing key. Nothing was stored.
	ErrUnroutable = errors.New("publisher: message unroutable")

	// ErrNacked: the broker refused the message (basic.nack), for example a
	// queue with x-overflow=reject-publish is full.
	ErrNacked = errors.New("publisher: message nacked by the broker")

	// ErrClosed: the Publisher was closed. A publish that had sent its
	// message before the close, and had no confirm yet, fails with an error
	// that matches ErrNotConfirmed as well: the broker may have stored it.
	ErrClosed = errors.New("publisher: closed")

	// ErrNotConfirmed: the context ended or the confirm timeout passed before
	// the broker confirmed; the message may or may not have been stored.
	ErrNotConfirmed = errors.New("publisher: not confirmed")

	// ErrNotConnected: the context ended while the publisher had no
	// connection to the broker (an outage, or the broker blocking publishes
	// for a resource alarm). The error also matches ErrNotConfirmed: an
	// earlier attempt on a connection that then died may still have stored
	// the message. It says the broker, not the message, is at fault, so a
	// caller that counts tries per message (the outbox relay) can leave
	// this one uncounted.
	ErrNotConnected = errors.New("publisher: not connected")

	// ErrLoginRefused: New could not connect because the broker refused the
	// login: a wrong user name or password (403 ACCESS_REFUSED), a user
	// without permission on the virtual host or a virtual host that does not
	// exist (530 NOT_ALLOWED). The error unwraps to the broker's
	// *amqp.Error. A connection limit reached (530 too) does not match it.
	ErrLoginRefused = errors.New("publisher: the broker refused the login")
)

// UnroutableError is the error for a returned message; it matches
// ErrUnroutable.
type UnroutableError struct {
	Exchange   string
	RoutingKey string
	ReplyCode  uint16
	ReplyText  string
}

func (e *UnroutableError) Error() string {
	return fmt.Sprintf("publisher: message to exchange %q with routing key %q returned by the broker (%d %s): bind a queue for that key or publish elsewhere",
		e.Exchange, e.RoutingKey, e.ReplyCode, e.ReplyText)
}

func (e *UnroutableError) Is(target error) bool { return target == ErrUnroutable }

// ExchangeNotFoundError: the broker closed the channel with 404 because the
// exchange does not exist. The Publisher opens a new channel; the next
// Publish is not affected.
type ExchangeNotFoundError struct {
	Exchange string
	Reason   string // the broker's text
}

func (e *ExchangeNotFoundError) Error() string {
	return fmt.Sprintf("publisher: exchange %q does not exist (broker: %s): declare it before publishing", e.Exchange, e.Reason)
}

// ChannelError: the broker closed the channel with an exception while the
// message was unconfirmed, and the exception is put down to the message: the
// broker's text names its user-id, its expiration or its size past
// max_message_size (406, at once: RabbitMQ 4 refuses messages over 16 MiB),
// or, after an exception that the text pinned on no message (a publish to an
// internal exchange, say), the search among the messages lost with that
// channel left it the only one unconfirmed on a channel the broker closed
// again. Its unconfirmed neighbours were sent again in groups on channels of
// their own, and not failed. Publishing the same message again fails the
// same way until what the broker objects to changes. Code and Reason are the
// last exception's.
type ChannelError struct {
	Exchange string
	Code     int
	Reason   string
}

func (e *ChannelError) Error() string {
	return fmt.Sprintf("publisher: the broker closed the channel publishing to exchange %q (%d %s)", e.Exchange, e.Code, e.Reason)
}

// notConfirmedError says why no confirm arrived: the context ended, the
// confirm timeout passed, no connection came back in time, or sends kept
// failing. It matches ErrNotConfirmed and unwraps to the cause (a context
// error, for instance).
type notConfirmedError struct {
	exchange, key string
	cause         error
	lastLoss      error
	notConnected  bool // no live channel when the context ended
	unsent        bool // it ended before the message was sent: nothing was stored
}

func (e *notConfirmedError) Error() string {
	msg := fmt.Sprintf("publisher: message to exchange %q with routing key %q not confirmed: %v", e.exchange, e.key, e.cause)
	if e.lastLoss != nil {
		msg += fmt.Sprintf(" (last connection problem: %v)", e.lastLoss)
	}
	if e.unsent {
		return msg + "; it was not sent"
	}
	return msg + "; it may or may not have been stored"
}

func (e *notConfirmedError) Is(target error) bool {
	return target == ErrNotConfirmed || (e.notConnected && target == ErrNotConnected)
}
func (e *notConfirmedError) Unwrap() error { return e.cause }
