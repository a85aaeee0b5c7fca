package console

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Span is the stretch of time a queue's charts cover: from the first
// failure in its snapshot to the snapshot, cut into Buckets intervals of
// Step, each starting at a multiple of Step (UTC), so that the charts of one
// queue's groups line up and their tick labels are round times.
type Span struct {
	From    time.Time // the first bucket's start
	Step    time.Duration
	Buckets int
	// Now is when the snapshot was taken: the last bucket holds it.
	Now time.Time
}

// steps are the intervals a chart may count failures in. The shortest is a
// minute: the last interval is what "failing now" means, and a burst of
// dead letters a few seconds old has not stopped.
var steps = []time.Duration{
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour,
	24 * time.Hour, 2 * 24 * time.Hour, 7 * 24 * time.Hour, 14 * 24 * time.Hour, 28 * 24 * time.Hour,
}

// NewSpan is the span from first to now in at most maxBuckets intervals,
// the shortest of steps that fits (28 days when none does: older failures
// then fall in the first bucket), and at least maxBuckets/2 of them, reaching
// back before first when it is that close to now. A first after now (a
// clock ahead of this one) is taken as now.
func NewSpan(first, now time.Time, maxBuckets int) Span {
	if first.IsZero() || first.After(now) {
		first = now
	}
	step := steps[len(steps)-1]
	for _, s := range steps {
		if bucketsBetween(first, now, s) <= maxBuckets {
			step = s
			break
		}
	}
	n := max(min(bucketsBetween(first, now, step), maxBuckets), maxBuckets/2, 1)
	end := floor(now, step).Add(step)
	return Span{From: end.Add(-time.Duration(n) * step), Step: step, Buckets: n, Now: now}
}

// floor is t rounded down to a multiple of step since the Unix epoch.
func floor(t time.Time, step time.Duration) time.Time {
	return t.Truncate(step)
}

// bucketsBetween is how many intervals of step, at multiples of step, it
// takes to hold both first and now.
func bucketsBetween(first, now time.Time, step time.Duration) int {
	return int(floor(now, step).Sub(floor(first, step))/step) + 1
}

// To is the end of the last bucket.
func (s Span) To() time.Time { return s.From.Add(time.Duration(s.Buckets) * s.Step) }

// Count counts times into the span's buckets. A zero time is not counted
// (no header said when); one before the span falls in the first bucket, one
// after it (a clock ahead of this one) in the last.
func (s Span) Count(times []time.Time) []int {
	counts := make([]int, s.Buckets)
	if s.Buckets == 0 {
		return counts
	}
	for _, t := range times {
		if t.IsZero() {
			continue
		}
		i := int(t.Sub(s.From) / s.Step)
		if t.Before(s.From) {
			i = 0
		}
		counts[max(0, min(i, s.Buckets-1))]++
	}
	return counts
}

// StepText names the span's interval: "5 min", "1 h", "1 d".
func (s Span) StepText() string { return durationText(s.Step) }

// durationText writes d in its largest whole unit: 45 s, 5 min, 2 h, 3 d.
func durationText(d time.Duration) string {
	switch {
	case d >= 24*time.Hour:
		return strconv.Itoa(int(d/(24*time.Hour))) + " d"
	case d >= time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + " h"
	case d >= time.Minute:
		return strconv.Itoa(int(d/time.Minute)) + " min"
	}
	return strconv.Itoa(int(d/time.Second)) + " s"
}

// Activity says whether a group fails now: its last failure falls in the
// span's last bucket (the one holding the snapshot), or when it stopped.
type Activity struct {
	Now     bool
	Stopped time.Duration // since the last failure, when not Now
	Known   bool          // a failure time was known
}

// ActivityOf is what counts (of s) and last, the group's latest failure,
// say of it at the snapshot.
func (s Span) ActivityOf(counts []int, last time.Time) Activity {
	if last.IsZero() {
		return Activity{}
	}
	if len(counts) > 0 && counts[len(counts)-1] > 0 {
		return Activity{Now: true, Known: true}
	}
	return Activity{Stopped: max(0, s.Now.Sub(last)), Known: true}
}

// Text is what the page says of a: "failing now", "stopped 1 h ago".
func (a Activity) Text() string {
	switch {
	case !a.Known:
		return "no failure time"
	case a.Now:
		return "failing now"
	}
	return "stopped " + agoText(a.Stopped) + " ago"
}

// agoText writes d roughly, in its largest unit: 40 s, 12 min, 3 h, 2 d.
func agoText(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%d d", int(d/(24*time.Hour)))
	case d >= 2*time.Hour:
		return fmt.Sprintf("%d h", int(d/time.Hour))
	case d >= 2*time.Minute:
		return fmt.Sprintf("%d min", int(d/time.Minute))
	}
	return fmt.Sprintf("%d s", int(d/time.Second))
}

// tickText labels a bucket boundary for a span of step: the time of day
// for steps under a day (with the date where the day changes, or at the
// first tick), the date for longer ones; UTC.
func tickText(t time.Time, step time.Duration, withDate bool) string {
	t = t.UTC()
	switch {
	case step >= 24*time.Hour:
		return t.Format("Jan 2")
	case step < time.Minute:
		if withDate {
			return t.Format("Jan 2 15:04:05")
		}
		return t.Format("15:04:05")
	}
	if withDate {
		return t.Format("Jan 2 15:04")
	}
	return t.Format("15:04")
}

// bucketText names one bucket for a tooltip: "3 failures, 11:05–11:10 UTC".
func bucketText(n int, from time.Time, step time.Duration) string {
	var b strings.Builder
	if n == 1 {
		b.WriteString("1 failure, ")
	} else {
		fmt.Fprintf(&b, "%d failures, ", n)
	}
	to := from.Add(step)
	sameDay := from.UTC().YearDay() == to.Add(-time.Nanosecond).UTC().YearDay()
	b.WriteString(tickText(from, step, true))
	b.WriteString("–")
	b.WriteString(tickText(to, step, !sameDay && step < 24*time.Hour))
	b.WriteString(" UTC")
	return b.String()
}
