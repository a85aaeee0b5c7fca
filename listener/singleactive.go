package listener

import "time"

// A queue with single active consumer (x-single-active-consumer) delivers
// to one of its consumers at a time; the others wait until it goes. For a
// listener, more consumers there add no throughput, only standbys on the
// same connection, which go when it goes: scaling up must not keep adding
// them. The listener learns it one of two ways:
//
//   - declared: its own WithDeclare declared the queue with it
//     (dlx.Topology.SingleActiveConsumer or the argument in its
//     QueueArguments; Declare notes it on the channel, amqpconn). It is known
//     before the first consumer starts, on every broker.
//   - observed: a queue declared elsewhere, whose arguments AMQP cannot
//     read back (a passive declare returns the counts only, and how many
//     consumers it counts differs: classic queues count the waiting ones,
//     quorum queues do not). When a consumer of the listener that has been
//     consuming for starveAfter has never had a delivery while the others
//     worked, and the queue has messages ready, two looks in a row, the
//     queue holds back its messages from a consumer with room for them. On
//     an ordinary queue that does not happen: the broker sends a ready
//     message at once to any consumer with room in its prefetch, consumer
//     priorities included (a lower one gets messages while the higher ones
//     are full). The scaler adds nothing from the first such look, and from
//     the second on, and says so once. If a consumer other than the oldest
//     then gets a delivery after all (the ready messages were ones the
//     broker could not deliver yet), it scales again.
const (
	singleActiveUnknown int32 = iota
	singleActiveDeclared
	singleActiveObserved
)

// starveAfter is how long a consumer must have had no delivery, with
// messages ready, to count as starved (at least four scaling looks).
func (l *Listener) starveAfter() time.Duration {
	return max(time.Second, 4*l.cfg.scaleInterval)
}

// declaredSingleActive records that the listener's declarations gave the
// queue single active consumer.
func (l *Listener) declaredSingleActive() {
	l.singleActive.Store(singleActiveDeclared)
	if (l.cfg.min > 1 || l.cfg.max > 1) && l.singleActiveTold.CompareAndSwap(false, true) {
		l.cfg.logger.Warn("listener: the queue is declared with single active consumer (x-single-active-consumer): "+
			"the broker delivers to one consumer at a time, so the listener's other consumers only stand by on the same connection "+
			"and add no throughput, and it does not scale up on this queue. Use one consumer per listener (no WithConcurrentConsumers "+
			"or WithMaxConcurrentConsumers) and run the listener in several processes for failover, or drop single active consumer to share the work",
			"queue", l.queue, "concurrent_consumers", l.cfg.min, "max_concurrent_consumers", l.cfg.max)
	}
}

// singleActiveHolds reports whether the scaler must not add consumers: the
// queue is known to deliver to one at a time.
func (l *Listener) singleActiveHolds() bool { return l.singleActive.Load() != singleActiveUnknown }

// watchSingleActive looks, at each scaling tick while the queue is not known
// to be single-active, for a consumer of the listener that has had no
// delivery in starveAfter while others worked (worked: some consumer made
// calls or spent time in its handler since the last tick). With one, it
// reads the queue's depth: messages ready there mean the queue holds them
// back from a consumer with room, and the second such look in a row
// concludes the queue is single-active. Until the verdict the scaler adds
// no consumers (starvedLooks > 0).
func (s *session) watchSingleActive(now time.Time, mono int64, worked bool) {
	l := s.sv.l
	if l.singleActiveHolds() || len(s.active) < 2 {
		s.starvedLooks = 0
		return
	}
	starved := s.starvedConsumer(mono)
	if starved == nil || !worked {
		s.starvedLooks = 0
		return
	}
	depth, ok := s.depth(now)
	switch {
	case !ok:
		return // looked less than 200ms ago: the next tick looks
	case depth == 0:
		s.starvedLooks = 0
		return
	}
	s.starvedLooks++
	if s.starvedLooks < 2 || !l.singleActive.CompareAndSwap(singleActiveUnknown, singleActiveObserved) {
		return
	}
	s.starvedLooks = 0
	idle := time.Duration(mono - starved.lastActive.Load()).Round(time.Millisecond)
	if !l.singleActiveTold.CompareAndSwap(false, true) {
		l.cfg.logger.Debug("listener: a consumer has no message while the queue has messages ready: single active consumer; not scaling up",
			"queue", l.queue, "consumers", len(s.active), "ready", depth, "starved_consumer", starved.tag)
		return
	}
	l.cfg.logger.Warn("listener: a consumer has had no message for "+idle.String()+" while the others worked and the queue has messages ready: "+
		"the queue delivers to one consumer at a time (single active consumer, x-single-active-consumer), so more consumers add no "+
		"throughput, and the listener stops adding them. On such a queue use one consumer per listener (no WithMaxConcurrentConsumers) "+
		"and run the listener in several processes for failover, or declare the queue without single active consumer to share the work",
		"queue", l.queue, "consumers", len(s.active), "ready", depth, "starved_consumer", starved.tag)
}

// spareForVerdict keeps an idle consumer that has never had a delivery
// from being scaled down before watchSingleActive can tell whether the
// queue is single-active, which it needs the consumer for: with a short
// WithIdleTimeout the scaler would otherwise add and stop it in turn.
func (s *session) spareForVerdict(c *consumer, idle time.Duration) bool {
	l := s.sv.l
	if l.singleActiveHolds() || c.calls.Load() != 0 {
		return false
	}
	return s.starvedLooks > 0 || idle < l.starveAfter()+3*max(200*time.Millisecond, l.cfg.scaleInterval)
}

// starvedConsumer is a consumer that has been consuming for starveAfter
// without a single delivery, or nil.
func (s *session) starvedConsumer(mono int64) *consumer {
	after := s.sv.l.starveAfter()
	for _, c := range s.active {
		if !c.consuming.Load() || c.stopping.Load() || c.calls.Load() != 0 || c.inFlight.Load() != 0 {
			continue
		}
		// lastActive is the start until a call finishes
		if time.Duration(mono-c.lastActive.Load()) >= after {
			return c
		}
	}
	return nil
}

// seeSideBySide notes, as c takes in a delivery, whether another channel
// of the listener, open and not stopping, has taken one in since c's first:
// the queue serves them side by side, which a single-active queue never
// does. It delivers to its active consumer only, and to the next once that
// one is gone (cancelled, its channel closed), and the one gone takes in
// nothing after that: its reader is in the handler that outlived the
// consumer timeout, or the channel is closed. (Holding a delivery at the
// same moment would not do: the one gone may still run a handler when the
// next gets its first, and be told of its cancel on another goroutine a
// moment later.) Then the pool may run handlers side by side at once,
// rather than at the scaler's next look (seeParallel). It runs only until
// the listener knows.
func (l *Listener) seeSideBySide(c *consumer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := c.firstAdmit.Load()
	for o := range l.consumers {
		if o != c && o.lastAdmit.Load() > first && !o.stopping.Load() && !o.brokerCancelled.Load() && !o.ch.IsClosed() {
			if l.parallel.CompareAndSwap(false, true) {
				l.pool.setCeilingUnless(l.cfg.max, l.keepsOrder)
			}
			return
		}
	}
}

// seeParallel notes when a consumer other than the oldest gets deliveries:
// the queue serves several consumers at once, which on a single-active
// queue only the first of the listener's consumers (the first registered)
// would. Until then the scaler adds one consumer at a time, so that on a
// single-active queue it adds one that starves, not its maximum at once;
// and it clears a single active consumer concluded by watching.
func (s *session) seeParallel() {
	l := s.sv.l
	if l.parallel.Load() && l.singleActive.Load() != singleActiveObserved {
		return
	}
	oldest := true
	for _, c := range s.active {
		if !c.consuming.Load() || c.stopping.Load() || c.brokerCancelled.Load() || c.ch.IsClosed() {
			// (A consumer the broker cancelled, or whose channel closed, is
			// gone for the queue, though its reader may still be in a
			// handler: on a single-active queue the next one is active now.)
			continue
		}
		if !oldest && (c.calls.Load() != 0 || c.inFlight.Load() != 0) {
			l.parallel.Store(true)
			if l.singleActive.CompareAndSwap(singleActiveObserved, singleActiveUnknown) {
				l.cfg.logger.Info("listener: a second consumer has messages after all: the queue is not single active consumer; scaling up again",
					"queue", l.queue, "consumer", c.tag)
			}
			return
		}
		oldest = false
	}
}
