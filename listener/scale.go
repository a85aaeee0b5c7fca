package listener

import (
	"slices"
	"time"
)

// baseChannels is how many channels the session keeps at least: none while
// the kill switch has tripped; one for a careful start, a probe, or when the
// queue's order must hold; else the concurrent count, and at least two when
// the listener may scale: two channels that get messages at once tell it
// the queue is not single active consumer, which it must know before it runs
// handlers side by side (singleactive.go).
func (s *session) baseChannels() int {
	l := s.sv.l
	switch {
	case s.tripped:
		return 0
	case s.careful, s.probing, l.keepsOrder():
		return 1
	case l.cfg.max > 1:
		return max(l.cfg.min, 2)
	}
	return l.cfg.min
}

// channelCap is the most channels a listener opens: its maximum handlers
// with WithPrefetch (as many channels as handlers, each at that prefetch,
// can hold no fewer deliveries than before); with the default prefetch,
// enough for DefaultPrefetch deliveries per handler slot waiting between
// retries.
func (l *Listener) channelCap() int {
	base := max(l.cfg.min, 2)
	if l.cfg.prefetchSet {
		return max(base, l.cfg.max)
	}
	return min(max(base, (DefaultPrefetch*l.cfg.max+l.cfg.prefetch-1)/l.cfg.prefetch), MaxConsumers)
}

// updateCeiling sets how many handlers may run at once now: one during a
// careful start or a probe, while the queue's order must hold, or until two
// channels have had messages at once (seeParallel: before that the queue
// may be single active consumer, whose order handlers side by side would
// break); the maximum otherwise.
func (s *session) updateCeiling() {
	l := s.sv.l
	ceiling := l.cfg.max
	if s.careful || s.probing || l.keepsOrder() || !l.parallel.Load() {
		ceiling = 1
	}
	l.pool.setCeiling(ceiling)
}

// scale looks at the pool and the channels at every scaling tick: it
// watches for a single-active queue, grows or shrinks the pool of handler
// slots, and opens or closes channels.
func (s *session) scale() {
	l := s.sv.l
	now := time.Now()
	mono := monotime()
	first := s.lastSample.IsZero()
	s.lastSample = now
	var calls uint64
	for _, c := range s.active {
		n := c.calls.Load()
		calls += n - c.sampledCalls
		c.sampledCalls = n
	}
	peak, fullAt := l.pool.look()
	if len(s.active) == 0 {
		return
	}
	// On a single-active-consumer queue more channels add nothing, and
	// handlers side by side would break its order: the listener runs one
	// handler until two of its channels have had messages at once
	// (seeParallel), and once it is plain that the queue is single-active
	// it stops adding channels (singleactive.go).
	s.seeParallel()
	s.updateCeiling()
	if first {
		return // the calls counted so far are since the start, not the last look
	}
	s.watchSingleActive(now, mono, calls > 0 || l.pool.busy.Load() > 0)
	s.scalePool(now, mono, peak, fullAt)
	s.scaleChannels(now, mono)
}

// scalePool grows the pool by a slot when every slot is taken and messages
// wait at the broker (a delivery that waits for a slot in the process grows
// it at once: workers.enter), and shrinks it to the most calls that ran at
// once in the last look when none has found it full for the idle timeout.
func (s *session) scalePool(now time.Time, mono int64, peak int32, fullAt int64) {
	l := s.sv.l
	w := l.pool
	limit := w.limit.Load()
	if limit < w.ceiling.Load() && w.busy.Load() >= limit {
		if depth, ok := s.depth(now); ok && depth > 0 && w.grow() {
			l.cfg.logger.Debug("listener: more handlers at once", "queue", l.queue, "handlers", limit+1, "ready", depth)
		}
		return
	}
	if limit > w.floor && time.Duration(mono-fullAt) >= l.cfg.idleTimeout {
		w.shrinkTo(peak)
		if after := w.limit.Load(); after < limit {
			l.cfg.logger.Debug("listener: fewer handlers at once", "queue", l.queue, "handlers", after, "idle", time.Duration(mono-fullAt).Round(time.Millisecond))
		}
	}
}

// scaleChannels opens channels when every one is full of deliveries that
// do not wait for a handler slot (they wait between retries, or run while
// the pool has room) and messages wait at the broker, enough for the
// backlog at the prefetch; and closes channels above the base, newest first,
// that have had nothing in flight for the idle timeout.
func (s *session) scaleChannels(now time.Time, mono int64) {
	l := s.sv.l
	n := len(s.active)
	full := n > 0 && l.pool.busy.Load() < l.pool.ceiling.Load()
	for _, c := range s.active {
		if !full {
			break
		}
		full = !c.stopping.Load() && c.inFlight.Load() >= int64(c.prefetch) && c.waiting.Load() == 0
	}
	capacity := l.channelCap()
	if l.keepsOrder() {
		capacity = 1
	}
	if full && n < capacity && s.starvedLooks == 0 && (n == 1 || l.parallel.Load()) {
		depth, ok := s.depth(now)
		if ok && depth > 0 {
			add := max((depth+l.cfg.prefetch-1)/l.cfg.prefetch, 1)
			if !l.parallel.Load() {
				add = 1 // and no more until it has had messages (seeParallel)
			}
			add = min(add, capacity-n)
			started := 0
			for range add {
				if err := s.add(); err != nil {
					l.cfg.logger.Warn("listener: cannot open another channel", "queue", l.queue, "error", err)
					break
				}
				started++
			}
			l.cfg.logger.Debug("listener: channels full of deliveries waiting between retries: opened more", "queue", l.queue,
				"channels", len(s.active), "added", started, "ready", depth)
		}
		return
	}
	base := s.baseChannels()
	for i := len(s.active) - 1; i >= 0 && len(s.active) > base; i-- {
		c := s.active[i]
		idle := time.Duration(mono - c.lastActive.Load())
		if c.inFlight.Load() == 0 && idle >= l.cfg.idleTimeout && !s.spareForVerdict(c, idle) {
			c.stop()
			s.active = slices.Delete(s.active, i, i+1)
			l.cfg.logger.Debug("listener: closed an idle channel", "queue", l.queue, "channels", len(s.active), "idle", idle)
		}
	}
}

// depth is the number of ready messages, from a passive declare on a control
// channel, at most every 200ms; the parts of one look (same now) that ask
// share one read.
func (s *session) depth(now time.Time) (int, bool) {
	if now.Equal(s.lastDepth) {
		return s.depthRead, s.depthOK
	}
	if now.Sub(s.lastDepth) < 200*time.Millisecond {
		return 0, false
	}
	s.lastDepth = now
	s.depthRead, s.depthOK = s.readDepth()
	return s.depthRead, s.depthOK
}

func (s *session) readDepth() (int, bool) {
	if s.control == nil || s.control.IsClosed() {
		ch, err := s.conn.Channel()
		if err != nil {
			return 0, false
		}
		s.control = ch
	}
	q, err := s.control.QueueDeclarePassive(s.sv.l.queue, true, false, false, false, nil)
	if err != nil {
		return 0, false
	}
	return q.Messages, true
}

// WithScaleInterval sets how often the listener looks at its load: the
// messages ready at the broker, its channels, and whether to shrink the
// pool of handlers (a delivery that waits for a handler grows it at once,
// without waiting for a look). Default 250ms.
func WithScaleInterval(d time.Duration) Option {
	return func(c *config) {
		if d < 10*time.Millisecond {
			c.fail("WithScaleInterval expects at least 10ms, got %v", d)
		}
		c.scaleInterval = d
	}
}

// WithIdleTimeout sets how long the pool must have had a handler to spare
// before it shrinks toward the concurrent count, and how long a channel
// above the base count must have had nothing in flight before it closes.
// Default 10s.
func WithIdleTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail("WithIdleTimeout expects a duration > 0, got %v", d)
		}
		c.idleTimeout = d
	}
}
