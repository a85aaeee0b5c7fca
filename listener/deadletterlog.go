package listener

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// A downstream outage can dead-letter thousands of messages a minute: one
// warning each is a log storm that hides everything else. So the first
// dead letters of a burst are logged one by one, in full, and after that one
// summary line per interval says how many more, by error type. The budget
// comes back after an interval with none beyond it. Stats, the
// amqpretry.dead_lettered metric and OnRecover hooks still count every one.
// See WithDeadLetterLog.
//
// The listener keeps two: one for the dead letters, one for the messages
// that failed and went back to the broker (rejected or requeued).
type deadLetterLog struct {
	burst int
	every time.Duration
	// summary is the summary line's message, byKey the name of its counts.
	summary, byKey string

	mu     sync.Mutex
	since  time.Time      // the start of the current interval
	logged int            // logged in full since the budget last came back
	more   int            // not logged in full in this interval
	byType map[string]int // ... by error type
}

// deadLetterSummary is what one interval did not log in full.
type deadLetterSummary struct {
	more   int
	over   time.Duration
	byType map[string]int
}

// take counts one dead letter: full says to log it in full; a summary of
// the interval that just ended comes back when there is one to log.
func (dl *deadLetterLog) take(now time.Time, errorType string) (full bool, s *deadLetterSummary) {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	s = dl.rollLocked(now, false)
	if dl.logged < dl.burst {
		dl.logged++
		return true, s
	}
	dl.more++
	if dl.byType == nil {
		dl.byType = map[string]int{}
	}
	dl.byType[errorType]++
	return false, s
}

// due returns the summary of an interval that has ended (or, with final,
// of the one under way), if it left dead letters unlogged.
func (dl *deadLetterLog) due(now time.Time, final bool) *deadLetterSummary {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	return dl.rollLocked(now, final)
}

func (dl *deadLetterLog) rollLocked(now time.Time, final bool) *deadLetterSummary {
	if dl.since.IsZero() {
		dl.since = now
		return nil
	}
	if !final && now.Sub(dl.since) < dl.every {
		return nil
	}
	var s *deadLetterSummary
	if dl.more > 0 {
		s = &deadLetterSummary{more: dl.more, over: now.Sub(dl.since), byType: dl.byType}
		dl.more, dl.byType = 0, nil // the flood goes on: the budget stays spent
	} else {
		dl.logged = 0 // a quiet interval: the next burst is logged in full
	}
	dl.since = now
	return s
}

// byTypeText lists the error types, most frequent first, the first five.
func (s *deadLetterSummary) byTypeText() string {
	types := slices.Collect(maps.Keys(s.byType))
	slices.SortFunc(types, func(a, b string) int { return cmp.Or(s.byType[b]-s.byType[a], strings.Compare(a, b)) })
	var b strings.Builder
	for i, t := range types {
		if i == 5 {
			fmt.Fprintf(&b, ", and %d more types", len(types)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%d", t, s.byType[t])
	}
	return b.String()
}

// newLogs returns the listener's two limited logs (WithDeadLetterLog).
func newLogs(burst int, every time.Duration) (deadLetters, failures *deadLetterLog) {
	return &deadLetterLog{burst: burst, every: every, byKey: "by_error_type",
			summary: "listener: dead-lettered more messages than are logged one by one (WithDeadLetterLog); Stats and the metric count each"},
		&deadLetterLog{burst: burst, every: every, byKey: "by_settlement_and_error_type",
			summary: "listener: more messages failed than are logged one by one (WithDeadLetterLog); Stats counts each"}
}

// logSummary logs s, a summary of dl, if any.
func (l *Listener) logSummary(dl *deadLetterLog, s *deadLetterSummary) {
	if s == nil {
		return
	}
	l.cfg.logger.Warn(dl.summary, "queue", l.queue, "more", s.more, "in_the_last", s.over.Round(time.Millisecond), dl.byKey, s.byTypeText())
}

// logSummariesDue logs the summaries of both logs for an interval that has
// ended or, with final, for the one under way.
func (l *Listener) logSummariesDue(final bool) {
	now := time.Now()
	for _, dl := range [...]*deadLetterLog{l.deadLetters, l.failures} {
		l.logSummary(dl, dl.due(now, final))
	}
}
