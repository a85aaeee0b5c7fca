package publisher

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
)

// PublishAsync sends msg like Publish and returns once it is sent (or could
// not be); done is called exactly once, later, with what Publish would have
// returned: nil only after the broker's confirm, and otherwise the same
// errors (ErrUnroutable, ErrNacked, ErrNotConfirmed, *ChannelError, ...),
// after the same re-sends when a channel or the connection is lost. It is
// for a caller with many messages in flight (a relay, a recoverer), which
// would otherwise park a goroutine per message on its confirm.
//
// The rule: PublishAsync returns an error only when nothing was sent, and
// then done is never called (an invalid message, ErrClosed, a context that
// ended before the send: while waiting for room, for a connection, or
// already done); it returns nil when the message went out, and then done
// is called exactly once. done is never called before PublishAsync returns
// on the goroutine that called it.
//
// done runs on the Publisher's completion goroutine, one call at a time (so
// calls never overlap), after the publish's span has ended. It must be
// quick: while it runs, no other async publish of this Publisher completes
// and its room (WithMaxInFlight) is not given back. Hand heavy work to a
// goroutine of your own, and never wait in done for PublishAsync, Publish or
// Close of the same Publisher, nor for a lock held by a caller of
// PublishAsync: that can wait forever. A panic in done is logged, not
// propagated.
//
// At most WithMaxInFlight async publishes await their outcome at once: past
// that, PublishAsync waits for room until ctx ends. ctx bounds the publish
// as it does Publish's: its end fails the publish with ErrNotConfirmed,
// and so does the confirm timeout (WithConfirmTimeout).
func (p *Publisher) PublishAsync(ctx context.Context, exchange, key string, msg amqp.Publishing, done func(error)) (err error) {
	if done == nil {
		return errNoDone
	}
	pub := &publication{p: p, exchange: exchange, key: key, msg: msg, done: done, began: time.Now()}
	pub.ctx, pub.span = p.startSend(ctx, exchange, key, &pub.msg)
	ctx = pub.ctx
	returned := func(err error) error {
		p.endSend(ctx, pub.span, pub.began, exchange, err)
		return err
	}
	if err := p.check(exchange, key, &pub.msg); err != nil {
		return returned(err)
	}
	if !p.enterAsync() {
		return returned(ErrClosed)
	}
	if err := p.takeRoom(ctx, exchange, key); err != nil {
		p.leaveAsync()
		return returned(err)
	}
	gone := func(err error) error {
		<-p.room
		p.leaveAsync()
		return returned(err)
	}
	if ctx.Err() != nil {
		return gone(&notConfirmedError{exchange: exchange, key: key, cause: ctx.Err()})
	}
	cc, err := p.pickChannel(ctx, exchange, key)
	if err != nil {
		return gone(pub.tries.noChannel(exchange, key, err))
	}
	f, err := cc.send(ctx, exchange, key, &pub.msg, p.mandatory(ctx), pub)
	if err != nil {
		// Nothing is in flight: the outcome, or the next send, is ours to
		// decide here.
		pub.tries.noteSend(f, err)
		final, again := pub.tries.after(ctx, exchange, key, err)
		if !again {
			if pub.tries.sent {
				pub.complete(final) // the write may have gone out: done says so
				return nil
			}
			return gone(final)
		}
		pub.sendAgain(cc, err)
		return nil
	}
	// From here f's outcome may come at any time, on another goroutine:
	// only the context's watch is set up here, and it is undone if the
	// outcome came first.
	if ctx.Done() != nil {
		pub.watchContext(cc, f)
	}
	return nil
}

var errNoDone = errors.New("publisher: PublishAsync needs a done func to call with the outcome")

// takeRoom waits for room for one more async publish (WithMaxInFlight).
func (p *Publisher) takeRoom(ctx context.Context, exchange, key string) error {
	select {
	case p.room <- struct{}{}:
		return nil
	default:
	}
	select {
	case p.room <- struct{}{}:
		return nil
	case <-ctx.Done():
		return &notConfirmedError{exchange: exchange, key: key,
			cause: fmt.Errorf("waiting for one of the %d async publishes in flight to finish (WithMaxInFlight): %w", cap(p.room), ctx.Err())}
	case <-p.closing.Done():
		return ErrClosed
	}
}

// A publication is one async publish, from PublishAsync until its done has
// been called: the same journey as a Publish (tries), whose waits are
// callbacks instead of a goroutine's. Its first send's outcome comes from
// the channel's watcher (the confirm, a return, the channel's death, the
// confirm deadline), the isolator, or the context's end; a message lost
// with its channel is sent again by a goroutine of its own running
// Publish's loop (deliver), a rare path.
type publication struct {
	p             *Publisher
	ctx           context.Context
	exchange, key string
	msg           amqp.Publishing
	done          func(error)
	span          trace.Span
	began         time.Time
	tries         tries // read and written by one goroutine at a time: see outcome

	err error // the outcome, for the completion goroutine

	mu        sync.Mutex
	finished  bool
	stopWatch func() bool // undoes the context's watch
	isolation *time.Timer // the confirm deadline while the isolator searches
}

// outcome takes the outcome of one of pub's sends, the first to come for
// it. The decision is Publish's (tries.after); only one send is in flight
// at a time, so tries has one writer at a time.
func (pub *publication) outcome(f *inflight, err error) {
	if !f.answered.CompareAndSwap(false, true) {
		return
	}
	if err == nil {
		pub.complete(nil)
		return
	}
	pub.tries.sent = true
	final, again := pub.tries.after(pub.ctx, pub.exchange, pub.key, err)
	if !again {
		pub.complete(final)
		return
	}
	pub.sendAgain(nil, nil)
}

// sendAgain sends the message again, lost with its channel (or never
// written), on a goroutine of its own, as Publish would; failed and err are
// the channel and the error of a send that failed, if that was the loss.
func (pub *publication) sendAgain(failed *confirmChannel, err error) {
	pub.p.resends.Add(1)
	go func() {
		defer pub.p.resends.Done()
		if failed != nil {
			pub.p.afterSendFailure(pub.ctx, failed, err)
		}
		pub.complete(pub.p.deliver(pub.ctx, pub.exchange, pub.key, &pub.msg, &pub.tries))
	}()
}

// watchContext fails the first send when ctx ends before its outcome, as
// Publish's await does.
func (pub *publication) watchContext(cc *confirmChannel, f *inflight) {
	stop := context.AfterFunc(pub.ctx, func() {
		cc.forget(f.tag)
		f.abandoned.Store(true)
		pub.outcome(f, &notConfirmedError{exchange: pub.exchange, key: pub.key, cause: pub.ctx.Err()})
	})
	pub.mu.Lock()
	if pub.finished {
		pub.mu.Unlock()
		stop()
		return
	}
	pub.stopWatch = stop
	pub.mu.Unlock()
}

// expireAt fails f at its confirm deadline while the isolator, which took
// it from its dead channel, searches.
func (pub *publication) expireAt(f *inflight) {
	t := time.AfterFunc(time.Until(f.deadline), func() {
		f.abandoned.Store(true)
		pub.outcome(f, pub.timedOut())
	})
	pub.mu.Lock()
	if pub.finished {
		pub.mu.Unlock()
		t.Stop()
		return
	}
	pub.isolation = t
	pub.mu.Unlock()
}

func (pub *publication) timedOut() error {
	return &notConfirmedError{exchange: pub.exchange, key: pub.key, cause: fmt.Errorf("no confirm within %v (WithConfirmTimeout)", pub.p.cfg.confirmTimeout)}
}

// complete hands pub's outcome to the completion goroutine, once.
func (pub *publication) complete(err error) {
	pub.mu.Lock()
	if pub.finished {
		pub.mu.Unlock()
		return
	}
	pub.finished = true
	stop, isolation := pub.stopWatch, pub.isolation
	pub.mu.Unlock()
	if stop != nil {
		stop()
	}
	if isolation != nil {
		isolation.Stop()
	}
	pub.err = err
	pub.p.completions.add(pub)
}

// A completer calls the done funcs of async publishes, on one goroutine of
// the Publisher's, so that neither a channel's watcher nor any lock waits
// for a caller's code. It takes them in batches: under load, one wake-up
// completes many.
type completer struct {
	p       *Publisher
	mu      sync.Mutex
	queue   []*publication
	wake    chan struct{} // a queue that was empty is not
	stopped chan struct{} // no more to come: Close has seen every done called
	exited  chan struct{}
}

func (p *Publisher) startCompleter() *completer {
	c := &completer{p: p, wake: make(chan struct{}, 1), stopped: make(chan struct{}), exited: make(chan struct{})}
	go c.run()
	return c
}

func (c *completer) add(pub *publication) {
	c.mu.Lock()
	c.queue = append(c.queue, pub)
	first := len(c.queue) == 1
	c.mu.Unlock()
	if first {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

func (c *completer) run() {
	defer close(c.exited)
	var batch []*publication
	for {
		c.mu.Lock()
		batch, c.queue = c.queue, batch[:0]
		c.mu.Unlock()
		if len(batch) == 0 {
			select {
			case <-c.wake:
				continue
			case <-c.stopped:
				return
			}
		}
		for i, pub := range batch {
			c.finish(pub)
			batch[i] = nil
		}
	}
}

// finish ends pub's span, calls its done and gives back its room.
func (c *completer) finish(pub *publication) {
	p := c.p
	p.endSend(pub.ctx, pub.span, pub.began, pub.exchange, pub.err)
	func() {
		defer func() {
			if v := recover(); v != nil {
				p.cfg.logger.Error("publisher: a PublishAsync done func panicked", "panic", v, "stack", string(debug.Stack()))
			}
		}()
		pub.done(pub.err)
	}()
	<-p.room
	p.leaveAsync()
}

func (c *completer) stop() { close(c.stopped) }
func (c *completer) wait() { <-c.exited }
