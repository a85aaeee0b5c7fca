package publisher

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A confirmChannel is one confirm-mode channel shared by concurrent publishes.
//
// Correlating outcomes: the broker sends basic.return for an unroutable
// message before the basic.ack of the same message, and amqp091 hands both to
// listeners from its single reader goroutine, in that order. The channel's
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
// Locks: sendSlot serialises sends so that the channel's count of published
// messages equals the channel's delivery tags; it is a channel so that a
// publish queued behind a send stuck in a socket write can still give up when
// its context ends. mu guards the pending map and is never held while calling
// amqp091.
type confirmChannel struct {
	ch *amqp.Channel

	sendSlot     chan struct{} // a lock that waiters can give up on: see send
	published    uint64        // delivery tag of the last message sent; guarded by sendSlot
	sendingSince atomic.Int64  // unix nanos when the send in progress began, or 0

	// isolate takes the messages lost with the channel when the broker
	// closes it with an exception its text pins on none of them, and finds
	// the cause among them (see isolator); nil on the solo channel and on
	// the isolator's own. False: it cannot, they are failed as lost.
	isolate func(suspects []*inflight) bool

	mu       sync.Mutex
	pending  map[uint64]*inflight
	sendDone <-chan struct{} // the context of the latest send: see abandonedSend
	// sendDeadline is when the latest send's publish times out, if it has a
	// timeout of its own besides its context (publishAsync); else zero.
	sendDeadline time.Time
	dead         atomic.Bool // set under mu; read without it by pickChannel

	// expiring holds the async publishes sent on the channel in the order
	// of their confirm deadlines (mostly the order sent: one confirm timeout
	// for all, but for a publish with a shorter timeout of its own): the
	// watcher fails the first still pending when expiry fires. Guarded by
	// mu; settled ones are dropped from the front as confirms come.
	expiring []*inflight
	expiry   *time.Timer // armed whenever expiring is not empty

	done chan struct{} // closed when the watcher has exited
}

type inflight struct {
	tag           uint64
	exchange, key string
	body          []byte
	messageID     string
	correlationID string
	userID        string
	expiration    string
	headers       amqp.Table
	msg           *amqp.Publishing // as sent, for the isolator to send again
	mandatory     bool
	returned      *amqp.Return
	result        chan error  // receives exactly one outcome (a Publish's send)
	abandoned     atomic.Bool // its caller stopped waiting: not worth sending again

	// An async publish's send has no result channel: its outcome goes to
	// async, once (answered), from whichever comes first: the confirm, the
	// channel's death, the isolator, the confirm deadline or the context.
	async    *publication
	answered atomic.Bool
	deadline time.Time // an async send's confirm deadline: the confirm timeout from the send, or the publish's own if sooner; set before it is registered, then only read
}

// finish gives the send its outcome.
func (f *inflight) finish(err error) {
	if f.async != nil {
		f.async.outcome(f, err)
		return
	}
	f.result <- err
}

// matches reports whether r may be f's return: same destination, ids and
// body. With headers, only if the headers are the same too.
func (f *inflight) matches(r *amqp.Return, headers bool) bool {
	return f.returned == nil && f.exchange == r.Exchange && f.key == r.RoutingKey &&
		f.messageID == r.MessageId && f.correlationID == r.CorrelationId && bytes.Equal(f.body, r.Body) &&
		(!headers || sameTable(f.headers, r.Headers))
}

// sameTable compares a table as published with the same table read back
// from the wire, where an integer may come back as another width, a float32
// as a float64 and a timestamp to the second.
func sameTable(sent, got amqp.Table) bool {
	if len(sent) != len(got) {
		return false
	}
	for k, v := range sent {
		w, ok := got[k]
		if !ok || !sameField(v, w) {
			return false
		}
	}
	return true
}

func sameField(a, b any) bool {
	switch a := a.(type) {
	case amqp.Table:
		bt, ok := b.(amqp.Table)
		return ok && sameTable(a, bt)
	case []any:
		bs, ok := b.([]any)
		if !ok || len(a) != len(bs) {
			return false
		}
		for i := range a {
			if !sameField(a[i], bs[i]) {
				return false
			}
		}
		return true
	case time.Time:
		bt, ok := b.(time.Time)
		return ok && a.Unix() == bt.Unix()
	case []byte:
		bb, ok := b.([]byte)
		return ok && bytes.Equal(a, bb)
	}
	if x, ok := asNumber(a); ok {
		y, ok := asNumber(b)
		return ok && x == y
	}
	return a == b
}

func asNumber(v any) (float64, bool) {
	switch n := v.(type) {
	case int8:
		return float64(n), true
	case int16:
		return float64(n), true
	case int32:
		return float64(n), true
	case int64:
		return float64(n), true
	case int:
		return float64(n), true
	case uint8:
		return float64(n), true
	case uint16:
		return float64(n), true
	case uint32:
		return float64(n), true
	case float32:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}

// channelLostError: the channel closed before the message was confirmed;
// Publish tries again, on another channel if need be. cause is the channel's close error,
// if any; sendErr the error of a send that failed.
//
// attributed: the broker's text pinned the exception on another message,
// so this one is innocent.
type channelLostError struct {
	cause      *amqp.Error
	sendErr    error
	attributed bool
}

func (e *channelLostError) Error() string {
	switch {
	case e.sendErr != nil:
		return fmt.Sprintf("sending failed: %v", e.sendErr)
	case e.cause != nil:
		return fmt.Sprintf("channel closed before the confirm: %v", e.cause)
	}
	return "channel closed before the confirm"
}

// openConfirmChannel opens a confirm channel; when it closes, it reports itself
// once on died, unless died is nil. isolate: see confirmChannel.
func openConfirmChannel(conn *amqp.Connection, died chan<- *confirmChannel, isolate func([]*inflight) bool) (*confirmChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	cc := &confirmChannel{ch: ch, pending: make(map[uint64]*inflight), done: make(chan struct{}), sendSlot: make(chan struct{}, 1), isolate: isolate}
	cc.expiry = time.NewTimer(time.Hour)
	cc.expiry.Stop()
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 256))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1024))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		cc.watch(confirms, returns, closes)
		if died != nil {
			died <- cc
		}
		close(cc.done)
	}()
	return cc, nil
}

// send publishes msg and registers it before the broker can answer. With
// pub, it is an async publish's send: its outcome goes to pub, and the
// watcher fails it at its confirm deadline.
//
// bounded, if not nil, returns ctx bounded by the publish's timeout, for a
// send that must wait for its slot (see publishAsync).
func (cc *confirmChannel) send(ctx context.Context, exchange, key string, msg *amqp.Publishing, mandatory bool, pub *publication, bounded func() context.Context) (*inflight, error) {
	if !cc.takeSlotSoon() {
		if bounded != nil {
			ctx = bounded()
		}
		select {
		case cc.sendSlot <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	defer func() { <-cc.sendSlot }()
	var deadline time.Time // the publish's own, for abandonedSend
	if pub != nil {
		deadline = pub.deadline()
	}

	tag := cc.published + 1
	var f *inflight
	if pub != nil {
		// An async publish is sent from here once (publishAsync; a send
		// again is deliver's, without pub): its inflight was allocated
		// with it.
		f = &pub.first
	} else {
		f = &inflight{result: make(chan error, 1)}
	}
	f.tag = tag
	f.exchange, f.key, f.body = exchange, key, msg.Body
	f.messageID, f.correlationID, f.userID, f.expiration = msg.MessageId, msg.CorrelationId, msg.UserId, msg.Expiration
	f.headers = msg.Headers
	f.msg, f.mandatory = msg, mandatory
	f.async = pub
	if pub != nil {
		// Its confirm deadline is set before f is registered, not after
		// the write: a channel that dies in between hands f to the
		// isolator (die, expireAt), whose timer reads the deadline, and
		// a zero one would fail f at once.
		f.deadline = time.Now().Add(pub.p.cfg.confirmTimeout)
		if !deadline.IsZero() && deadline.Before(f.deadline) {
			f.deadline = deadline
		}
	}
	cc.mu.Lock()
	if cc.dead.Load() {
		cc.mu.Unlock()
		return nil, &channelLostError{}
	}
	cc.pending[tag] = f
	cc.sendDone, cc.sendDeadline = ctx.Done(), deadline
	cc.mu.Unlock()

	cc.sendingSince.Store(time.Now().UnixNano())
	err := cc.ch.PublishWithContext(ctx, exchange, key, mandatory, false, *msg)
	cc.sendingSince.Store(0)
	if err != nil {
		cc.forget(tag)
		if pub != nil && !f.answered.CompareAndSwap(false, true) {
			// The channel died under the send and gave f its outcome,
			// which pub has taken: that is the one it acts on.
			return f, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err() // checked before sending: nothing went out
		}
		if errors.Is(err, amqp.ErrClosed) {
			return nil, &channelLostError{} // it closed before we wrote: nothing went out
		}
		// The message is valid (Publish checked it), so the connection
		// failed under the send.
		return nil, &channelLostError{sendErr: err}
	}
	cc.published = tag
	if pub != nil {
		cc.expireLater(f)
	}
	return f, nil
}

// takeSlotSoon takes the send slot if it is free or soon is: its holder is
// most often in the middle of a write of a few microseconds, which is not
// worth a bounded context and its timer (see publishAsync) for a wait.
func (cc *confirmChannel) takeSlotSoon() bool {
	for i := range 4 {
		select {
		case cc.sendSlot <- struct{}{}:
			return true
		default:
		}
		if i < 3 {
			runtime.Gosched()
		}
	}
	return false
}

// expireLater queues f, just sent, to be failed if no confirm comes by its
// deadline. The queue is kept in the order of the deadlines: sends are
// serialised (sendSlot) and most share the confirm timeout, so f goes at
// the end but for a publish whose own timeout is shorter (publishAsync).
func (cc *confirmChannel) expireLater(f *inflight) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	deadline := f.deadline
	if cc.dead.Load() {
		return // die has taken the pending, f with them if it was still there
	}
	i := len(cc.expiring)
	for i > 0 && cc.expiring[i-1].deadline.After(deadline) {
		i--
	}
	cc.expiring = slices.Insert(cc.expiring, i, f)
	if i == 0 {
		cc.expiry.Reset(time.Until(deadline))
	}
}

// expire fails the async publishes whose confirm deadline has passed and
// arms expiry for the next.
func (cc *confirmChannel) expire() {
	now := time.Now()
	var expired []*inflight
	cc.mu.Lock()
	for len(cc.expiring) > 0 {
		f := cc.expiring[0]
		pending := cc.pending[f.tag] == f
		if pending && now.Before(f.deadline) {
			cc.expiry.Reset(f.deadline.Sub(now))
			break
		}
		cc.expiring[0] = nil
		cc.expiring = cc.expiring[1:]
		if pending {
			delete(cc.pending, f.tag)
			expired = append(expired, f)
		}
	}
	cc.mu.Unlock()
	for _, f := range expired {
		f.abandoned.Store(true)
		f.finish(f.async.timedOut(f))
	}
}

// dropSettled drops the settled publishes from the front of expiring; mu is
// held.
func (cc *confirmChannel) dropSettled() {
	for len(cc.expiring) > 0 && cc.pending[cc.expiring[0].tag] != cc.expiring[0] {
		cc.expiring[0] = nil
		cc.expiring = cc.expiring[1:]
	}
	if len(cc.expiring) == 0 {
		cc.expiring = nil // let go of the array and what it held
	}
}

// stalledFor is how long the send in progress has been stuck, or 0.
func (cc *confirmChannel) stalledFor(now time.Time) time.Duration {
	if since := cc.sendingSince.Load(); since != 0 {
		return now.Sub(time.Unix(0, since))
	}
	return 0
}

// abandonedSend reports whether the send in progress has been stuck in a
// socket write for at least d after its caller stopped waiting: amqp091
// does not see a context end once it writes, so only closing the
// connection frees that caller.
func (cc *confirmChannel) abandonedSend(now time.Time, d time.Duration) bool {
	if cc.stalledFor(now) < d {
		return false
	}
	cc.mu.Lock()
	done, deadline := cc.sendDone, cc.sendDeadline
	cc.mu.Unlock()
	if !deadline.IsZero() && !now.Before(deadline) {
		return true
	}
	select {
	case <-done:
		return true
	default:
		return false // (a nil done never ends)
	}
}

// forget drops a publish whose caller stopped waiting; a late confirm is
// ignored.
func (cc *confirmChannel) forget(tag uint64) {
	cc.mu.Lock()
	delete(cc.pending, tag)
	cc.mu.Unlock()
}

func (cc *confirmChannel) alive() bool { return !cc.dead.Load() }

func (cc *confirmChannel) close() {
	_ = cc.ch.Close()
	<-cc.done
}

func (cc *confirmChannel) watch(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
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
			cc.drainReturns(returns)
			cc.settle(c)
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			cc.markReturned(&r)
		case e, ok := <-closes:
			if !ok {
				closes = nil
				continue
			}
			closeErr = e
		case <-cc.expiry.C:
			cc.expire()
		}
	}
	cc.expiry.Stop()
	cc.die(closeErr)
}

func (cc *confirmChannel) drainReturns(returns <-chan amqp.Return) {
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				return
			}
			cc.markReturned(&r)
		default:
			return
		}
	}
}

func (cc *confirmChannel) settle(c amqp.Confirmation) {
	cc.mu.Lock()
	f := cc.pending[c.DeliveryTag]
	delete(cc.pending, c.DeliveryTag)
	if f != nil && f.async != nil {
		cc.dropSettled()
	}
	cc.mu.Unlock()
	if f == nil {
		return // its caller gave up
	}
	switch {
	case !c.Ack:
		f.finish(fmt.Errorf("%w: exchange %q, routing key %q", ErrNacked, f.exchange, f.key))
	case f.returned != nil:
		f.finish(&UnroutableError{Exchange: f.exchange, RoutingKey: f.key, ReplyCode: f.returned.ReplyCode, ReplyText: f.returned.ReplyText})
	default:
		f.finish(nil)
	}
}

func (cc *confirmChannel) markReturned(r *amqp.Return) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	// Messages that differ only in headers (on a headers exchange, one may
	// be routed and the other not) are told apart by them. Should the
	// headers read back compare unequal to every pending message's, the
	// return still fails each that matches otherwise: reporting a returned
	// message as stored is the one mistake not to make.
	marked := false
	for _, f := range cc.pending {
		if f.matches(r, true) {
			f.returned, marked = r, true
		}
	}
	if marked {
		return
	}
	for _, f := range cc.pending {
		if f.matches(r, false) {
			f.returned = r
		}
	}
}

// die fails every publish still waiting. An exception the broker's text
// attributes to a pending message (a 404 naming its exchange, a 406 naming
// its user-id, its expiration or its size past max_message_size) is that
// message's own failure; the others were lost with the channel and are
// published again by their callers, knowing whether the cause was found.
// When the text names none of them, they go to the isolator, which finds
// the cause and gives each its outcome.
func (cc *confirmChannel) die(closeErr *amqp.Error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.dead.Store(true)
	cc.expiring = nil
	var innocent []*inflight
	attributed := false
	for tag, f := range cc.pending {
		delete(cc.pending, tag)
		switch {
		case closeErr == nil:
			f.finish(&channelLostError{})
		case closeErr.Code == amqp.NotFound && strings.Contains(closeErr.Reason, "exchange '"+f.exchange+"'"):
			f.finish(&ExchangeNotFoundError{Exchange: f.exchange, Reason: closeErr.Reason})
			attributed = true
		case closeErr.Code == amqp.PreconditionFailed && f.userID != "" && strings.Contains(closeErr.Reason, "user_id property set to '"+f.userID+"'"),
			closeErr.Code == amqp.PreconditionFailed && f.expiration != "" && strings.Contains(closeErr.Reason, "invalid expiration '"+f.expiration+"'"),
			closeErr.Code == amqp.PreconditionFailed && strings.Contains(closeErr.Reason, "message size "+strconv.Itoa(len(f.body))+" is larger than"):
			f.finish(&ChannelError{Exchange: f.exchange, Code: closeErr.Code, Reason: closeErr.Reason})
			attributed = true
		default:
			innocent = append(innocent, f)
		}
	}
	if len(innocent) > 0 && !attributed && isChannelException(closeErr) && cc.isolate != nil {
		// In the order they were sent, for a search a reader can follow.
		slices.SortFunc(innocent, func(a, b *inflight) int { return cmp.Compare(a.tag, b.tag) })
		for _, f := range innocent {
			if f.async != nil {
				f.async.expireAt(f) // as a Publish's await would, while the isolator searches
			}
		}
		if cc.isolate(innocent) {
			return
		}
	}
	for _, f := range innocent {
		f.finish(&channelLostError{cause: closeErr, attributed: attributed})
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
