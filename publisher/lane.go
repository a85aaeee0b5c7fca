package publisher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A lane is one confirm-mode channel shared by concurrent publishes.
//
// Correlating outcomes: the broker sends basic.return for an unroutable
// message before the basic.ack of the same message, and amqp091 hands both to
// listeners from its single reader goroutine, in that order. The lane's
// watcher reads returns and confirms from unbuffered channels in one
// goroutine, so it always sees a message's return before its ack. A return
// carries no delivery tag, so it is matched by content; when identical
// messages are in flight, all of them are failed as unroutable (the callers
// publish again) rather than risk reporting a returned one as confirmed.
//
// Returns are read from a buffered channel and drained before each confirm
// is settled: amqp091 drops a notification that waits more than 5s, and a
// dropped return would turn an unroutable message into a confirmed one.
//
// Locks: sendSlot serialises sends so that the lane's count of published
// messages equals the channel's delivery tags; it is a channel so that a
// publish queued behind a send stuck in a socket write can still give up when
// its context ends. mu guards the pending map and is never held while calling
// amqp091.
type lane struct {
	ch *amqp.Channel

	sendSlot     chan struct{} // a lock that waiters can give up on: see send
	published    uint64        // delivery tag of the last message sent; guarded by sendSlot
	sendingSince atomic.Int64  // unix nanos when the send in progress began, or 0

	mu      sync.Mutex
	pending map[uint64]*inflight
	dead    atomic.Bool // set under mu; read without it by pickLane

	done chan struct{} // closed when the watcher has exited
}

type inflight struct {
	tag           uint64
	exchange, key string
	body          []byte
	messageID     string
	correlationID string
	userID        string
	returned      *amqp.Return
	result        chan error // receives exactly one outcome
}

func (f *inflight) matches(r *amqp.Return) bool {
	return f.returned == nil && f.exchange == r.Exchange && f.key == r.RoutingKey &&
		f.messageID == r.MessageId && f.correlationID == r.CorrelationId && bytes.Equal(f.body, r.Body)
}

// errLaneLost: the lane's channel closed before the message was confirmed;
// Publish tries again on another lane. cause is the channel's close error,
// if any; sendErr the error of a send that failed.
type errLaneLost struct {
	cause   *amqp.Error
	sendErr error
}

func (e *errLaneLost) Error() string {
	switch {
	case e.sendErr != nil:
		return fmt.Sprintf("sending failed: %v", e.sendErr)
	case e.cause != nil:
		return fmt.Sprintf("channel closed before the confirm: %v", e.cause)
	}
	return "channel closed before the confirm"
}

// openLane opens a confirm channel; when it closes, the lane reports itself
// once on died.
func openLane(conn *amqp.Connection, died chan<- *lane) (*lane, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	l := &lane{ch: ch, pending: make(map[uint64]*inflight), done: make(chan struct{}), sendSlot: make(chan struct{}, 1)}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 256))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1024))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		l.watch(confirms, returns, closes)
		died <- l
		close(l.done)
	}()
	return l, nil
}

// send publishes msg and registers it before the broker can answer.
func (l *lane) send(ctx context.Context, exchange, key string, msg *amqp.Publishing) (*inflight, error) {
	select {
	case l.sendSlot <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-l.sendSlot }()

	tag := l.published + 1
	f := &inflight{
		tag:      tag,
		exchange: exchange, key: key, body: msg.Body,
		messageID: msg.MessageId, correlationID: msg.CorrelationId, userID: msg.UserId,
		result: make(chan error, 1),
	}
	l.mu.Lock()
	if l.dead.Load() {
		l.mu.Unlock()
		return nil, &errLaneLost{}
	}
	l.pending[tag] = f
	l.mu.Unlock()

	l.sendingSince.Store(time.Now().UnixNano())
	err := l.ch.PublishWithContext(ctx, exchange, key, true, false, *msg)
	l.sendingSince.Store(0)
	if err != nil {
		l.forget(tag)
		if ctx.Err() != nil {
			return nil, ctx.Err() // checked before sending: nothing went out
		}
		if errors.Is(err, amqp.ErrClosed) {
			return nil, &errLaneLost{} // it closed before we wrote: nothing went out
		}
		// The message is valid (Publish checked it), so the connection
		// failed under the send.
		return nil, &errLaneLost{sendErr: err}
	}
	l.published = tag
	return f, nil
}

// stalledFor is how long the send in progress has been stuck, or 0.
func (l *lane) stalledFor(now time.Time) time.Duration {
	if since := l.sendingSince.Load(); since != 0 {
		return now.Sub(time.Unix(0, since))
	}
	return 0
}

// forget drops a publish whose caller stopped waiting; a late confirm is
// ignored.
func (l *lane) forget(tag uint64) {
	l.mu.Lock()
	delete(l.pending, tag)
	l.mu.Unlock()
}

func (l *lane) alive() bool { return !l.dead.Load() }

func (l *lane) close() {
	_ = l.ch.Close()
	<-l.done
}

func (l *lane) watch(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	var closeErr *amqp.Error
	// amqp091 closes all three when the channel shuts down; reading until
	// then delivers every confirm the broker sent before the close.
	for confirms != nil || returns != nil || closes != nil {
		select {
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			// The broker sent any return for this message before its ack, and
			// amqp091 queued it before the confirm: take it first.
			l.drainReturns(returns)
			l.settle(c)
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			l.markReturned(&r)
		case e, ok := <-closes:
			if !ok {
				closes = nil
				continue
			}
			closeErr = e
		}
	}
	l.die(closeErr)
}

func (l *lane) drainReturns(returns <-chan amqp.Return) {
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				return
			}
			l.markReturned(&r)
		default:
			return
		}
	}
}

func (l *lane) settle(c amqp.Confirmation) {
	l.mu.Lock()
	f := l.pending[c.DeliveryTag]
	delete(l.pending, c.DeliveryTag)
	l.mu.Unlock()
	if f == nil {
		return // its caller gave up
	}
	switch {
	case !c.Ack:
		f.result <- fmt.Errorf("%w: exchange %q, routing key %q", ErrNacked, f.exchange, f.key)
	case f.returned != nil:
		f.result <- &UnroutableError{Exchange: f.exchange, RoutingKey: f.key, ReplyCode: f.returned.ReplyCode, ReplyText: f.returned.ReplyText}
	default:
		f.result <- nil
	}
}

func (l *lane) markReturned(r *amqp.Return) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.pending {
		if f.matches(r) {
			f.returned = r
		}
	}
}

// die fails every publish still waiting. An exception the broker's text
// attributes to a pending message (a 404 naming its exchange, a 406 naming
// its user-id) is that message's own failure; the others were lost with the
// channel and are published again by their callers.
func (l *lane) die(closeErr *amqp.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dead.Store(true)
	for tag, f := range l.pending {
		delete(l.pending, tag)
		switch {
		case closeErr == nil:
			f.result <- &errLaneLost{}
		case closeErr.Code == amqp.NotFound && strings.Contains(closeErr.Reason, "exchange '"+f.exchange+"'"):
			f.result <- &ExchangeNotFoundError{Exchange: f.exchange, Reason: closeErr.Reason}
		case closeErr.Code == amqp.PreconditionFailed && f.userID != "" && strings.Contains(closeErr.Reason, "user_id property set to '"+f.userID+"'"):
			f.result <- &ChannelError{Exchange: f.exchange, Code: closeErr.Code, Reason: closeErr.Reason}
		default:
			f.result <- &errLaneLost{cause: closeErr}
		}
	}
}

// isChannelException reports a close caused by a message or command on the
// channel rather than by the connection going away.
func isChannelException(e *amqp.Error) bool {
	if e == nil {
		return false
	}
	switch e.Code {
	case amqp.ContentTooLarge, amqp.NoConsumers, amqp.AccessRefused, amqp.NotFound, amqp.ResourceLocked, amqp.PreconditionFailed:
		return true
	}
	return false
}
