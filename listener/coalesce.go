package listener

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amqpretry/amqpretry/middleware/chainrun"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Ack coalescing (WithAckCoalescing) acks a run of handled deliveries with
// one basic.ack(multiple=true) instead of one basic.ack each.
//
// A multiple ack of tag T settles every delivery of the channel that is
// still unsettled with a tag up to T, and the broker closes the channel
// (406 PRECONDITION_FAILED, "unknown delivery tag T") if T itself is not
// unsettled; deliveries settled alone before it are simply not among those
// it settles (checked on RabbitMQ 3.10.8 and 4.3.6). So T is always a
// handled delivery that waits for its ack, and every unsettled delivery
// below it has been handled too: the handled prefix of what the channel
// holds. Deliveries complete out of order (one parked between retries
// completes after many read after it), so a handled delivery behind one
// still in flight cannot be covered: when the bound comes (N waiting, or the
// first of them waiting D), those are acked one by one. A failure is
// rejected or nacked alone at once, after the handled prefix below it has
// been acked, and leaves the tracking: no ack ever covers it.

// settler settles the deliveries of one consumer, on the consumer's channel
// only: delivery tags are per channel, and a delivery whose channel has
// closed is back in the queue, never to be settled on another.
//
// Its API is the same whether deliveries are handled one by one or in
// batches:
//
//   - received(tag): the reader, for each delivery it will handle, in the
//     order they arrive and before any of them can be settled.
//   - settle(tag, how): once per received delivery, from any goroutine.
//   - forget(tag): instead of settle, for a received delivery that must not
//     be settled (the broker took it back at a consumer timeout).
//   - abandon(): the broker has taken back every unsettled delivery of the
//     channel while it stays open (a RabbitMQ 4.3 consumer timeout): acks
//     that wait are dropped, and nothing more is settled.
//   - close(flush): once, when every received delivery has been settled or
//     forgotten; flush writes the acks that wait (a graceful stop) rather
//     than dropping them (the channel is gone, the broker redelivers them).
//
// Without coalescing (max 1) settle writes at once and the rest do nothing.
type settler struct {
	ch    amqp.Acknowledger // the consumer's channel
	acked *atomic.Uint64    // Stats().Handled: deliveries acked
	max   int               // acks that may wait; 1: none waits
	delay time.Duration     // how long the first of them may wait
	now   func() int64      // monotime, or a test's clock
	// lost hears of acks of n handled deliveries that could not be written:
	// the broker redelivers them.
	lost func(n int, err error)

	mu   sync.Mutex
	out  []unsettled // received and not settled yet, in tag order, from head
	head int
	// waiting counts the handled deliveries among out, whose acks wait;
	// since is when the first of them began to wait.
	waiting int
	since   int64
	armed   bool // timer is set to fire
	off     bool // abandoned or closed: nothing more is settled
	closed  bool

	timer    *time.Timer
	quit     chan struct{} // closed by close: the flusher ends
	finished chan struct{} // closed by the flusher as it ends
}

// unsettled is one received delivery that has not been settled.
type unsettled struct {
	tag     uint64
	handled bool // its ack waits
}

// pending returns how many handled deliveries wait for their ack.
func (s *settler) pending() int {
	if s.max <= 1 {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

// errAbandoned is settle's answer once the broker has taken back the
// channel's deliveries or the consumer has finished.
var errAbandoned = errors.New("listener: the channel's unsettled deliveries went back to the broker")

// newSettler returns the settler of a consumer reading from ch. With
// maxAcks below 2 each delivery is settled at once.
func newSettler(ch amqp.Acknowledger, acked *atomic.Uint64, maxAcks int, maxDelay time.Duration, lost func(int, error)) *settler {
	if lost == nil {
		lost = func(int, error) {}
	}
	return &settler{ch: ch, acked: acked, max: max(maxAcks, 1), delay: maxDelay, now: monotime, lost: lost}
}

func (s *settler) coalescing() bool { return s.max > 1 }

// start runs the flusher, which writes the acks that have waited the
// delay, under wg. It ends when close is called.
func (s *settler) start(wg *sync.WaitGroup) {
	if !s.coalescing() {
		return
	}
	s.timer = time.NewTimer(time.Hour)
	s.timer.Stop()
	s.quit, s.finished = make(chan struct{}), make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(s.finished)
		for {
			select {
			case <-s.timer.C:
				s.flushDue()
			case <-s.quit:
				return
			}
		}
	}()
}

// received tracks a delivery that will be settled (or forgotten) later.
func (s *settler) received(tag uint64) {
	if !s.coalescing() {
		return
	}
	s.mu.Lock()
	if !s.off {
		s.push(tag)
	}
	s.mu.Unlock()
}

// settle settles the delivery as how says. An ack may wait (the error is
// then nil, and an ack that fails later is told to lost); a reject or a
// nack goes out at once, alone, after the acks of the handled deliveries
// below it.
func (s *settler) settle(tag uint64, how chainrun.Settlement) error {
	if !s.coalescing() {
		return s.alone(tag, how)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off {
		return errAbandoned
	}
	i := s.find(tag)
	if how == chainrun.Ack && i >= 0 {
		s.out[i].handled = true
		s.waiting++
		if s.waiting == 1 {
			s.since = s.now()
			s.arm()
		}
		if s.waiting >= s.max {
			s.flush(true)
		}
		return nil
	}
	// A failure: out on its own, and first. The handled prefix below it
	// stops before it (it is not handled), so acking that prefix now
	// covers nothing of it; and once it has gone out it leaves the
	// tracking, so no later ack names it.
	s.flushPrefix()
	err := s.alone(tag, how)
	s.remove(tag)
	return err
}

// forget stops tracking a received delivery that will not be settled.
func (s *settler) forget(tag uint64) {
	if !s.coalescing() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remove(tag)
}

// abandon drops the acks that wait and settles nothing more: the broker has
// taken the channel's unsettled deliveries back.
func (s *settler) abandon() {
	if !s.coalescing() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.off = true
	s.out, s.head, s.waiting = nil, 0, 0
}

// close ends the flusher and, with flush, writes the acks that wait; it
// runs once every received delivery has been settled or forgotten.
func (s *settler) close(flush bool) {
	if !s.coalescing() {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	if s.quit != nil {
		close(s.quit)
		<-s.finished
		s.timer.Stop()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off {
		return
	}
	if flush {
		s.flush(true)
	} else if s.waiting > 0 {
		s.lost(s.waiting, errAbandoned)
	}
	s.off = true
	s.out, s.head, s.waiting = nil, 0, 0
}

// flushDue writes the acks that wait if the first has waited the delay, or
// sets the timer for when it will have.
func (s *settler) flushDue() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed = false
	if s.off || s.waiting == 0 {
		return
	}
	if left := s.delay - time.Duration(s.now()-s.since); left > 0 {
		if s.timer != nil {
			s.armed = true
			s.timer.Reset(left)
		}
		return
	}
	s.flush(true)
}

// arm sets the timer to fire after the delay, unless it is set already
// (then it fires early, and flushDue sets it again for the rest).
func (s *settler) arm() {
	if s.armed || s.timer == nil {
		return
	}
	s.armed = true
	s.timer.Reset(s.delay)
}

// flush acks the handled prefix with one multiple ack; with all, also the
// handled deliveries behind one still in flight, each alone, since a
// multiple ack would cover that one too.
func (s *settler) flush(all bool) {
	s.flushPrefix()
	if !all || s.waiting == 0 {
		return
	}
	kept := s.head
	for i := s.head; i < len(s.out); i++ {
		u := s.out[i]
		if u.handled {
			s.ack(u.tag, false, 1)
			continue
		}
		s.out[kept] = u
		kept++
	}
	s.out = s.out[:kept]
	s.waiting = 0
}

// flushPrefix acks, with one ack, the handled deliveries from the lowest
// unsettled one up to the first still in flight.
func (s *settler) flushPrefix() {
	i := s.head
	for i < len(s.out) && s.out[i].handled {
		i++
	}
	n := i - s.head
	if n == 0 {
		return
	}
	last := s.out[i-1].tag
	s.head = i
	if s.head == len(s.out) {
		s.out, s.head = s.out[:0], 0
	}
	s.waiting -= n
	s.ack(last, n > 1, n)
}

// ack writes one ack for n deliveries.
func (s *settler) ack(tag uint64, multiple bool, n int) {
	if err := s.ch.Ack(tag, multiple); err != nil {
		s.lost(n, err)
		return
	}
	s.acked.Add(uint64(n))
}

// alone settles one delivery by itself, as chainrun.Settle does.
func (s *settler) alone(tag uint64, how chainrun.Settlement) error {
	var err error
	switch how {
	case chainrun.Ack:
		if err = s.ch.Ack(tag, false); err == nil {
			s.acked.Add(1)
		}
	case chainrun.Reject:
		err = s.ch.Reject(tag, false)
	case chainrun.Release:
		err = s.ch.Nack(tag, false, true)
	default:
		err = s.ch.Reject(tag, true)
	}
	if err != nil {
		return fmt.Errorf("listener: %s of delivery %d failed: %w", how, tag, err)
	}
	return nil
}

// push appends a received delivery; tags grow on a channel.
func (s *settler) push(tag uint64) {
	if s.head > 0 && len(s.out) == cap(s.out) {
		n := copy(s.out, s.out[s.head:])
		s.out, s.head = s.out[:n], 0
	}
	s.out = append(s.out, unsettled{tag: tag})
}

// find returns the index of tag in out, or -1.
func (s *settler) find(tag uint64) int {
	if n := len(s.out); n > s.head && s.out[n-1].tag == tag {
		return n - 1 // the one the reader just handled: the usual case
	}
	live := s.out[s.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].tag >= tag })
	if i < len(live) && live[i].tag == tag {
		return s.head + i
	}
	return -1
}

// remove stops tracking tag, if it is tracked.
func (s *settler) remove(tag uint64) {
	i := s.find(tag)
	if i < 0 {
		return
	}
	if s.out[i].handled {
		s.waiting--
	}
	if i == s.head {
		s.head++
		if s.head == len(s.out) {
			s.out, s.head = s.out[:0], 0
		}
		return
	}
	s.out = append(s.out[:i], s.out[i+1:]...)
}

// MaxAckCoalescingDelay bounds WithAckCoalescing's delay: an ack held back
// longer helps throughput no more, and keeps a delivery unsettled on the
// broker, toward its consumer timeout, for nothing.
const MaxAckCoalescingDelay = time.Minute

// WithAckCoalescing acks handled deliveries together: one basic.ack with
// multiple=true for a run of them instead of one basic.ack each (Spring
// AMQP's batchSize on the SimpleMessageListenerContainer, messagesPerAck
// and ackTimeout on the DirectMessageListenerContainer). The acks of at
// most maxDeliveries handled deliveries per consumer wait, none of them
// longer than maxDelay: the maxDeliveries-th, or maxDelay after the first
// of them, writes them.
//
// A multiple ack settles every unsettled delivery of its channel up to its
// tag, so it only ever names the last of a run that begins at the channel's
// oldest unsettled delivery and holds handled deliveries alone. A delivery
// still in flight (waiting between retries, say) ends the run: the handled
// deliveries read after it are acked one by one when the bound comes, and
// it keeps its place. A failure is rejected or nacked at once, on its own,
// after the run below it has been acked.
//
// The price: a connection or channel lost with acks waiting hands those
// messages back to the queue although they were handled, at most
// maxDeliveries per consumer, and they are handled again (as on a crash,
// and counted again toward a quorum queue's x-delivery-count). A graceful
// shutdown, a scale-down and a trip of the kill switch write the waiting
// acks before the channel closes. Stats().Handled counts deliveries as their
// acks are written. A consumer at prefetch 1 (the careful start of
// WithRedeliveryLimit, the kill switch's probe) acks each delivery at once.
//
// maxDeliveries is 2 to the prefetch (WithPrefetch): a consumer stops
// receiving while its prefetch is full of deliveries that wait for their
// acks, so a quarter of it leaves room to keep the deliveries flowing
// (62 of the default 250). maxDelay is 1ms to MaxAckCoalescingDelay; tens
// of milliseconds suit most queues. Default: off, each delivery acked at
// once.
func WithAckCoalescing(maxDeliveries int, maxDelay time.Duration) Option {
	return func(c *config) {
		if maxDeliveries < 2 || maxDeliveries > 65535 {
			c.fail("WithAckCoalescing expects 2 to 65535 deliveries (1 acks each delivery at once, the default), got %d", maxDeliveries)
		}
		if maxDelay < time.Millisecond || maxDelay > MaxAckCoalescingDelay {
			c.fail("WithAckCoalescing expects a delay of 1ms to %v, got %v", MaxAckCoalescingDelay, maxDelay)
		}
		c.coalesceAcks, c.coalesceDelay = maxDeliveries, maxDelay
	}
}
