package publisher

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/handoff"
	"github.com/amqpretry/amqpretry/internal/pubasync"
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
	return p.publishAsync(ctx, exchange, key, msg, p.mandatory(ctx), 0, done)
}

func init() {
	pubasync.Publish = func(p any, ctx context.Context, exchange, key string, msg amqp.Publishing, mandatory bool, timeout time.Duration, done func(error)) error {
		return p.(*Publisher).publishAsync(ctx, exchange, key, msg, mandatory, timeout, done)
	}
}

// publishAsync is PublishAsync with mandatory given, and, when timeout > 0,
// bounded by it as by a context.WithTimeout of ctx, without one: the
// confirm's deadline is the earlier of the confirm timeout and the publish's,
// and a bounded context is made only for what must wait (for room, a
// channel, a send slot, a send again), which a healthy flood never does. A
// recoverer's copy saves so a timer, a context and a watch on it per
// message.
func (p *Publisher) publishAsync(ctx context.Context, exchange, key string, msg amqp.Publishing, mandatory bool, timeout time.Duration, done func(error)) (err error) {
	if done == nil {
		return errNoDone
	}
	pub := &publication{p: p, exchange: exchange, key: key, msg: msg, done: done, began: time.Now(), mandatory: mandatory, timeout: timeout}
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
	// wait is the context of what must wait: ctx, bounded by the timeout.
	wait, cancelWait := ctx, context.CancelFunc(nil)
	bounded := func() context.Context {
		if timeout > 0 && cancelWait == nil {
			wait, cancelWait = context.WithDeadline(ctx, pub.deadline())
		}
		return wait
	}
	defer func() {
		if cancelWait != nil {
			cancelWait()
		}
	}()
	if !p.roomNow() {
		if err := p.takeRoom(bounded(), exchange, key); err != nil {
			p.leaveAsync()
			return returned(err)
		}
	}
	gone := func(err error) error {
		<-p.room
		p.leaveAsync()
		return returned(err)
	}
	if err := pub.ended(ctx); err != nil {
		return gone(&notConfirmedError{exchange: exchange, key: key, cause: err, unsent: true})
	}
	cc := p.channelNow()
	if cc == nil {
		if cc, err = p.pickChannel(bounded(), exchange, key); err != nil {
			return gone(pub.tries.noChannel(exchange, key, err))
		}
	}
	f, err := cc.send(ctx, exchange, key, &pub.msg, mandatory, pub, bounded)
	if err != nil {
		// Nothing is in flight: the outcome, or the next send, is ours to
		// decide here.
		pub.tries.noteSend(f, err)
		final, again := pub.tries.after(pub.boundedOrEnded(), exchange, key, err)
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

// roomNow takes room for one more async publish if there is some.
func (p *Publisher) roomNow() bool {
	select {
	case p.room <- struct{}{}:
		return true
	default:
		return false
	}
}

// takeRoom waits for room for one more async publish (WithMaxInFlight).
func (p *Publisher) takeRoom(ctx context.Context, exchange, key string) error {
	if p.roomNow() {
		return nil
	}
	select {
	case p.room <- struct{}{}:
		return nil
	case <-ctx.Done():
		return &notConfirmedError{exchange: exchange, key: key,
			cause: fmt.Errorf("waiting for one of the %d async publishes in flight to finish (WithMaxInFlight): %w", cap(p.room), ctx.Err()), unsent: true}
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
	mandatory     bool
	timeout       time.Duration // > 0: the publish's own bound besides ctx (publishAsync)

	err error // the outcome, for the completion goroutine

	mu        sync.Mutex
	finished  bool
	stopWatch func() bool // undoes the context's watch
	isolation *time.Timer // the confirm deadline while the isolator searches

	// first is the send from publishAsync (confirmChannel.send), in the
	// same allocation: one fewer per message.
	first inflight
}

// deadline is when the publish's timeout ends it; zero without one.
func (pub *publication) deadline() time.Time {
	if pub.timeout <= 0 {
		return time.Time{}
	}
	return pub.began.Add(pub.timeout)
}

// ended is the error of ctx, or of the publish's timeout, once either ended.
func (pub *publication) ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if pub.timeout > 0 && !time.Now().Before(pub.deadline()) {
		return context.DeadlineExceeded
	}
	return nil
}

// boundedOrEnded is what tries.after needs of the publish's context: only
// whether it ended, and why.
func (pub *publication) boundedOrEnded() context.Context {
	if pub.timeout > 0 {
		if err := pub.ended(pub.ctx); err != nil && pub.ctx.Err() == nil {
			return endedContext{Context: pub.ctx, err: err}
		}
	}
	return pub.ctx
}

// endedContext is a context seen as ended with err (the publish's timeout).
type endedContext struct {
	context.Context
	err error
}

func (c endedContext) Err() error { return c.err }

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
	final, again := pub.tries.after(pub.boundedOrEnded(), pub.exchange, pub.key, err)
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
		// Publish's loop, with the mandatory flag and the timeout that
		// publishAsync had as arguments.
		ctx := WithMandatoryContext(pub.ctx, pub.mandatory)
		if pub.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, pub.deadline())
			defer cancel()
		}
		if failed != nil {
			pub.p.afterSendFailure(ctx, failed, err)
		}
		pub.complete(pub.p.deliver(ctx, pub.exchange, pub.key, &pub.msg, &pub.tries))
	}()
}

// watchContext fails the first send when ctx ends before its outcome, as
// Publish's await does.
func (pub *publication) watchContext(cc *confirmChannel, f *inflight) {
	ended := func() {
		cc.forget(f.tag)
		f.abandoned.Store(true)
		pub.outcome(f, &notConfirmedError{exchange: pub.exchange, key: pub.key, cause: pub.ctx.Err()})
	}
	var stop func() bool
	if af, ok := pub.ctx.(afterFuncer); ok {
		// Its own AfterFunc, as context.AfterFunc would call it, without
		// the context that one wraps around it.
		stop = af.AfterFunc(ended)
	} else {
		stop = context.AfterFunc(pub.ctx, ended)
	}
	pub.mu.Lock()
	if pub.finished {
		pub.mu.Unlock()
		stop()
		return
	}
	pub.stopWatch = stop
	pub.mu.Unlock()
}

// afterFuncer is a context that tells of its end itself (as the context
// package's own do, and the listener's for a recoverer's work).
type afterFuncer interface {
	AfterFunc(func()) func() bool
}

// expireAt fails f at its confirm deadline while the isolator, which took
// it from its dead channel, searches.
func (pub *publication) expireAt(f *inflight) {
	t := time.AfterFunc(time.Until(f.deadline), func() {
		f.abandoned.Store(true)
		pub.outcome(f, pub.timedOut(f))
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

// timedOut is the error of a send failed at its confirm deadline, f's.
func (pub *publication) timedOut(f *inflight) error {
	if pub.timeout > 0 && !f.deadline.Before(pub.deadline()) {
		// The publish's own timeout, as a context.WithTimeout's end.
		return &notConfirmedError{exchange: pub.exchange, key: pub.key, cause: context.DeadlineExceeded}
	}
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
	p      *Publisher
	queue  *handoff.Queue[*publication]
	exited chan struct{}
}

func (p *Publisher) startCompleter() *completer {
	c := &completer{p: p, queue: handoff.New[*publication](), exited: make(chan struct{})}
	go c.run()
	return c
}

func (c *completer) add(pub *publication) { c.queue.Put(pub) }

func (c *completer) run() {
	defer close(c.exited)
	var batch []*publication
	for {
		batch = c.queue.Take(batch[:0], math.MaxInt)
		if len(batch) == 0 {
			return // stopped, and every done called
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

// stop says no more will come: Close has seen every done called.
func (c *completer) stop() { c.queue.Close() }
func (c *completer) wait() { <-c.exited }
