package listener

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The broker closes a consumer's channel when one of its deliveries stays
// unacknowledged past consumer_timeout (30 minutes by default), and every
// delivery on that channel goes back to the queue. What a delivery may spend
// here is more than its Retry's waits, which New checks: its handler's time
// on every attempt, its turns at the consumer's gate behind the others, and
// its time in the prefetch buffer behind a busy handler. That cannot be
// known in advance, so the listener watches, on every scaling tick:
//
//   - the age of each delivery in flight: the one the reader is handling,
//     and those parked between attempts. It warns once per delivery at 80%
//     of the timeout.
//   - each consumer's prefetch times its mean handler time: how long the
//     last of a full prefetch waits before its handler even starts. It warns
//     once per consumer when that reaches 80% of the timeout.
//
// Deliveries handled at once (the usual case) cost an atomic store and a
// compare-and-swap; only parking takes a lock.

// ageWarning is the share of the consumer timeout at which a delivery's age
// is worth a warning: early enough for an operator to act on it.
const ageWarning = 0.8

// Where a delivery stands in its consumer's parked list.
const (
	unlisted int32 = iota
	listed
	settled
)

// parkedList is a consumer's parked deliveries, in the order they parked,
// which is the order they were read: the first is the oldest.
type parkedList struct {
	mu          sync.Mutex
	first, last *delivery
}

// park lists dd, unless it is settled already (a WillWait from a goroutine
// its handler left behind). spare, if not nil, is dd's place in the list
// for its first park, in a record dd has already (its recovery's): else
// one is allocated.
func (p *parkedList) park(dd *delivery, spare *parkLink) (listedNow bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !dd.place.CompareAndSwap(unlisted, listed) {
		return false
	}
	if dd.link == nil {
		if dd.link = spare; spare == nil {
			dd.link = &parkLink{}
		}
	}
	dd.link.prev, dd.link.next = p.last, nil
	if p.last != nil {
		p.last.link.next = dd
	} else {
		p.first = dd
	}
	p.last = dd
	return true
}

// unpark takes dd off the list and leaves it as it was before park.
func (p *parkedList) unpark(dd *delivery) {
	p.settle(dd)
	dd.place.Store(unlisted)
}

// settle takes dd off the list if it is on it; for a delivery that never
// parked it takes no lock.
func (p *parkedList) settle(dd *delivery) {
	if dd.place.CompareAndSwap(unlisted, settled) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if dd.place.Swap(settled) != listed {
		return
	}
	link := dd.link
	if link.prev != nil {
		link.prev.link.next = link.next
	} else {
		p.first = link.next
	}
	if link.next != nil {
		link.next.link.prev = link.prev
	} else {
		p.last = link.prev
	}
	link.prev, link.next = nil, nil
}

// oldest is the age at now of the consumer's oldest delivery in flight, 0
// when there is none.
func (c *consumer) oldest(now int64) time.Duration {
	var oldest int64 = math.MaxInt64
	if n, at := c.ahead.aheadStats(); n > 0 {
		oldest = at
	}
	if dd := c.current.Load(); dd != nil {
		oldest = min(oldest, dd.received)
	}
	c.parked.mu.Lock()
	if dd := c.parked.first; dd != nil {
		oldest = min(oldest, dd.received)
	}
	c.parked.mu.Unlock()
	if oldest == math.MaxInt64 {
		return 0
	}
	return time.Duration(now - oldest)
}

// arrivals are the monotimes at which the oldest of a consumer's
// deliveries in each state arrived, math.MaxInt64 for a state with none.
type arrivals struct{ inFlight, prefetched, running, parked int64 }

func noArrivals() arrivals {
	return arrivals{math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64}
}

// arrivals looks at every delivery of c in flight, for Stats: those read
// ahead; the reader's current one (running, or about to: in the chain
// before its handler, or waiting for a slot); and the parked ones (running
// off the reader, or waiting between attempts).
func (c *consumer) arrivals(a *arrivals) {
	if n, at := c.ahead.aheadStats(); n > 0 {
		a.prefetched = min(a.prefetched, at)
	}
	if dd := c.current.Load(); dd != nil {
		if dd.inHandler.Load() {
			a.running = min(a.running, dd.received)
		} else {
			a.prefetched = min(a.prefetched, dd.received)
		}
	}
	c.parked.mu.Lock()
	for dd := c.parked.first; dd != nil; dd = dd.link.next {
		if dd.inHandler.Load() {
			a.running = min(a.running, dd.received)
		} else {
			a.parked = min(a.parked, dd.received)
		}
	}
	c.parked.mu.Unlock()
	a.inFlight = min(a.inFlight, a.prefetched, a.running, a.parked)
}

// age is how long ago, at now, the monotime at was; 0 for none.
func age(now, at int64) time.Duration {
	if at == math.MaxInt64 {
		return 0
	}
	return time.Duration(now - at)
}

// aged returns the deliveries of c in flight for warnAt or longer that have
// not been warned about yet, and marks them. Only watchAges calls it.
func (c *consumer) aged(now int64, warnAt time.Duration) []*delivery {
	var out []*delivery
	old := func(dd *delivery) bool { return time.Duration(now-dd.received) >= warnAt }
	if dd := c.current.Load(); dd != nil && old(dd) && !dd.agedWarned.Swap(true) {
		out = append(out, dd)
	}
	c.parked.mu.Lock()
	defer c.parked.mu.Unlock()
	for dd := c.parked.first; dd != nil && old(dd); dd = dd.link.next {
		if !dd.agedWarned.Swap(true) {
			out = append(out, dd)
		}
	}
	return out
}

// watchAges warns about deliveries in flight for most of the consumer
// timeout, and about consumers whose prefetch alone holds deliveries that
// long.
func (l *Listener) watchAges() {
	warnAt := time.Duration(float64(l.cfg.consumerTimeout) * ageWarning)
	now := monotime()
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.consumers {
		for _, dd := range c.aged(now, warnAt) {
			l.cfg.logger.Warn("listener: a delivery has been unsettled for most of the broker's consumer_timeout; "+
				"past it, RabbitMQ closes the consumer's channel and requeues every delivery on it. "+
				"Shorten the handler or its retries (hand long delays to dlx retry tiers), lower WithPrefetch so fewer "+
				"deliveries wait their turn behind the handler, or raise consumer_timeout and WithConsumerTimeout together",
				"queue", l.queue, "consumer", c.tag, "message_id", dd.id, "delivery_tag", dd.tag,
				"age", time.Duration(now-dd.received).Round(time.Second), "consumer_timeout", l.cfg.consumerTimeout)
		}
		calls := c.calls.Load()
		if calls == 0 || c.prefetchWarned {
			continue
		}
		mean := time.Duration(c.busyNanos.Load() / int64(calls))
		// The pool runs that many handlers at once over the prefetch.
		if backlog := mean * time.Duration(l.cfg.prefetch) / time.Duration(max(l.pool.limit.Load(), 1)); backlog >= warnAt {
			c.prefetchWarned = true
			l.cfg.logger.Warn("listener: with this prefetch and handler time, the last delivery of a full prefetch waits most of the broker's "+
				"consumer_timeout before its handler starts; past it, RabbitMQ closes the channel and requeues every delivery on it. "+
				"Lower WithPrefetch, add consumers, or raise consumer_timeout and WithConsumerTimeout together",
				"queue", l.queue, "consumer", c.tag, "prefetch", l.cfg.prefetch, "mean_handler_time", mean.Round(time.Millisecond),
				"wait", backlog.Round(time.Second), "consumer_timeout", l.cfg.consumerTimeout)
		}
	}
}

// IsConsumerTimeout reports whether err is the broker closing a channel
// because a delivery on it stayed unacknowledged past its consumer timeout
// (406 PRECONDITION_FAILED, "delivery acknowledgement on channel N timed
// out", on RabbitMQ 3.10 and 4.0 alike).
func IsConsumerTimeout(err *amqp.Error) bool {
	return err != nil && err.Code == amqp.PreconditionFailed &&
		strings.Contains(err.Reason, "delivery acknowledgement on channel") && strings.Contains(err.Reason, "timed out")
}

// tellConsumerTimeout says plainly what the broker's channel error means.
func (l *Listener) tellConsumerTimeout(c *consumer, err *amqp.Error) {
	setting := "consumer_timeout in rabbitmq.conf (30 minutes by default), or on RabbitMQ 4 the queue's x-consumer-timeout argument or consumer-timeout policy"
	if l.cfg.consumerTimeoutArg > 0 {
		setting = "x-consumer-timeout on the consumer (WithConsumerTimeoutArgument), where the broker honours it, else " + setting
	}
	l.cfg.logger.Error("listener: RabbitMQ closed a consumer's channel because a delivery on it stayed unacknowledged past the broker's "+
		"consumer timeout; every unacknowledged delivery of that channel goes back to the queue and will be redelivered (and counted, on a "+
		"quorum queue). Make handlers stop in time (middleware.Timeout), hand long retry delays to dlx retry tiers, lower WithPrefetch, "+
		"or raise the setting and WithConsumerTimeout together",
		"queue", l.queue, "consumer", c.tag, "setting", setting, "consumer_timeout_assumed", l.cfg.consumerTimeout, "broker_said", err.Reason)
}

// queueExists asks the broker, on a channel of its own, whether the queue is
// there: after a basic.cancel it tells a consumer timeout (RabbitMQ 4.3
// quorum queues) from a deleted queue. False when it cannot tell.
func (l *Listener) queueExists(conn *amqp.Connection) bool {
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(l.queue, true, false, false, false, nil)
	return err == nil
}

// tellConsumerCancelled says what a basic.cancel of a queue that still
// exists means: on RabbitMQ 4.3 quorum queues, a delivery outlived the
// consumer timeout.
func (l *Listener) tellConsumerCancelled(c *consumer) {
	setting := "the queue's x-consumer-timeout argument, a consumer-timeout policy, or consumer_timeout in rabbitmq.conf (30 minutes by default)"
	if l.cfg.consumerTimeoutArg > 0 {
		setting = fmt.Sprintf("x-consumer-timeout %v on the consumer (WithConsumerTimeoutArgument)", l.cfg.consumerTimeoutArg)
	}
	l.cfg.logger.Error("listener: the broker cancelled a consumer of a queue that still exists: a delivery stayed unacknowledged past "+
		"the consumer timeout (RabbitMQ 4.3 quorum queues cancel the consumer rather than close its channel). The broker has returned its "+
		"unacknowledged deliveries to the queue, not counted as failures, and will redeliver them; their handlers' contexts are cancelled "+
		"and a new consumer replaces this one. Make handlers stop in time (middleware.Timeout), hand long retry delays to the broker "+
		"(dlx), lower WithPrefetch, or raise the setting and WithConsumerTimeout together",
		"queue", l.queue, "consumer", c.tag, "setting", setting, "oldest_in_flight", c.oldest(monotime()).Round(time.Millisecond),
		"consumer_timeout_assumed", l.cfg.consumerTimeout)
}
