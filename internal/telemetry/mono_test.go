package telemetry

import (
	"testing"
	"time"
)

// MonoTime gives back the instant Mono read: on the monotonic clock
// exactly, on the wall clock as time.Now would have.
func TestMonoTimeIsTheInstantMonoRead(t *testing.T) {
	before := time.Now()
	a := Mono()
	time.Sleep(2 * time.Millisecond)
	b := Mono()
	after := time.Now()
	ta, tb := MonoTime(a), MonoTime(b)
	if got := tb.Sub(ta); got != time.Duration(b-a) {
		t.Errorf("MonoTime(b) - MonoTime(a) = %v, want %v", got, time.Duration(b-a))
	}
	if ta.Before(before) || tb.After(after) {
		t.Errorf("MonoTime gave %v and %v, outside %v to %v", ta, tb, before, after)
	}
	// The wall clock too, as a span exporter reads it.
	if wa, wb := ta.Round(0), tb.Round(0); wa.Before(before.Round(0).Add(-time.Millisecond)) || wb.After(after.Round(0).Add(time.Millisecond)) {
		t.Errorf("wall readings %v and %v, outside %v to %v", wa, wb, before, after)
	}
}
