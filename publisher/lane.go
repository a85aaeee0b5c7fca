package publisher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

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
// Locks: pubMu serialises sends so that the lane's count of published
// messages equals the channel's delivery tags; mu guards the pending map and
// is never held while calling amqp091, so the reader goroutine can always
// hand a confirm to the watcher.
type lane struct {
	ch *amqp.Channel

	pubMu     sync.Mutex
	published uint64 // delivery tag of the last message sent

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
	returned      *amqp.Return
	result        chan error // receives exactly one outcome
}

func (f *inflight) matches(r *amqp.Return) bool {
	return f.returned == nil && f.exchange == r.Exchange && f.key == r.RoutingKey &&
		f.messageID == r.MessageId && f.correlationID == r.CorrelationId && bytes.Equal(f.body, r.Body)
}

// errLaneLost: the lane's channel closed before the message was confirmed;
// Publish tries again on another lane. cause is the channel's close error.
type errLaneLost struct{ cause *amqp.Error }

func (e *errLaneLost) Error() string {
	if e.cause == nil {
		return "channel closed before the confirm"
	}
	return fmt.Sprintf("channel closed before the confirm: %v", e.cause)
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
	l := &lane{ch: ch, pending: make(map[uint64]*inflight), done: make(chan struct{})}
	// Unbuffered on purpose: see the type's comment.
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	returns := ch.NotifyReturn(make(chan amqp.Return))
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
	l.pubMu.Lock()
	defer l.pubMu.Unlock()

	tag := l.published + 1
	f := &inflight{
		tag:      tag,
		exchange: exchange, key: key, body: msg.Body,
		messageID: msg.MessageId, correlationID: msg.CorrelationId,
		result: make(chan error, 1),
	}
	l.mu.Lock()
	if l.dead.Load() {
		l.mu.Unlock()
		return nil, &errLaneLost{}
	}
	l.pending[tag] = f
	l.mu.Unlock()

	if err := l.ch.PublishWithContext(ctx, exchange, key, true, false, *msg); err != nil {
		l.forget(tag)
		if errors.Is(err, amqp.ErrClosed) {
			return nil, &errLaneLost{}
		}
		return nil, err
	}
	l.published = tag
	return f, nil
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

// die fails every publish still waiting. A 404 naming a pending message's
// exchange is that message's own fault; the others were lost with the
// channel and are published again by their callers.
func (l *lane) die(closeErr *amqp.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dead.Store(true)
	for tag, f := range l.pending {
		delete(l.pending, tag)
		if closeErr != nil && closeErr.Code == amqp.NotFound && strings.Contains(closeErr.Reason, "exchange '"+f.exchange+"'") {
			f.result <- &ExchangeNotFoundError{Exchange: f.exchange, Reason: closeErr.Reason}
			continue
		}
		f.result <- &errLaneLost{cause: closeErr}
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
