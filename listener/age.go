package listener

import (
	"sync"
	"time"
)

// The broker closes a consumer's channel when one of its deliveries stays
// unacknowledged past consumer_timeout (30 minutes by default), and every
// delivery on that channel goes back to the queue. What a delivery may spend
// here is more than its Retry's waits, which New checks: its handler's time
// on every attempt, and its turns at the consumer's gate behind the other
// deliveries of the prefetch. That cannot be known in advance, so the
// listener watches the age of each consumer's oldest unsettled delivery and
// warns before the broker acts.

// ageWarning is the share of the consumer timeout at which a delivery's age
// is worth a warning: early enough for an operator to act on it.
const ageWarning = 0.8

// unsettled is a consumer's deliveries in flight, in the order they were
// read: the first is the oldest. A list rather than a map so that the oldest
// costs nothing to find and a delivery nothing to add or remove.
type unsettled struct {
	mu          sync.Mutex
	first, last *delivery
}

func (u *unsettled) add(dd *delivery) {
	u.mu.Lock()
	dd.prev, dd.next = u.last, nil
	if u.last != nil {
		u.last.next = dd
	} else {
		u.first = dd
	}
	u.last = dd
	u.mu.Unlock()
}

func (u *unsettled) remove(dd *delivery) {
	u.mu.Lock()
	if dd.prev != nil {
		dd.prev.next = dd.next
	} else {
		u.first = dd.next
	}
	if dd.next != nil {
		dd.next.prev = dd.prev
	} else {
		u.last = dd.prev
	}
	dd.prev, dd.next = nil, nil
	u.mu.Unlock()
}

// oldest returns the age of the oldest delivery in flight at now (0 when
// none is), and the delivery itself the first time its age reaches warnAt,
// so that each is warned about once.
func (u *unsettled) oldest(now int64, warnAt time.Duration) (time.Duration, *delivery) {
	u.mu.Lock()
	defer u.mu.Unlock()
	dd := u.first
	if dd == nil {
		return 0, nil
	}
	age := time.Duration(now - dd.received)
	if age < warnAt || dd.agedWarned {
		return age, nil
	}
	dd.agedWarned = true
	return age, dd
}

// watchAges warns about each delivery that has been in flight for most of
// the consumer timeout, and returns the age of the oldest one.
func (s *session) watchAges() {
	l := s.sv.l
	warnAt := time.Duration(float64(l.cfg.consumerTimeout) * ageWarning)
	now := monotime()
	for _, c := range s.active {
		age, dd := c.unsettled.oldest(now, warnAt)
		if dd == nil {
			continue
		}
		l.cfg.logger.Warn("listener: a delivery has been unsettled for most of the broker's consumer_timeout; "+
			"past it, RabbitMQ closes the consumer's channel and requeues every delivery on it. "+
			"Shorten the handler or its retries (hand long delays to dlx retry tiers), lower WithPrefetch so fewer "+
			"deliveries wait their turn behind the handler, or raise consumer_timeout and WithConsumerTimeout together",
			"queue", l.queue, "consumer", c.tag, "message_id", dd.MessageId, "delivery_tag", dd.DeliveryTag,
			"age", age.Round(time.Second), "consumer_timeout", l.cfg.consumerTimeout)
	}
}
