package listener

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/amqpretry/amqpretry/middleware"
)

func TestKillSwitchStateMachine(t *testing.T) {
	cfg := KillSwitch{TripThreshold: 0.5, ActivationThreshold: 4, TrackingPeriod: 10 * time.Second, RestartTimeout: time.Second, MaxRestartTimeout: 3 * time.Second}
	t0 := time.Unix(1_000_000, 0)
	type step struct {
		at     time.Duration // since t0
		failed bool
	}
	tests := []struct {
		name  string
		steps []step
		trips bool
	}{
		{"below the activity threshold", []step{{0, true}, {time.Second, true}, {2 * time.Second, true}}, false},
		{"at the trip threshold", []step{{0, false}, {time.Second, true}, {2 * time.Second, false}, {3 * time.Second, true}}, true},
		{"below the trip threshold", []step{{0, false}, {time.Second, true}, {2 * time.Second, false}, {3 * time.Second, false}, {4 * time.Second, true}}, false},
		{"old failures slide out", []step{{0, true}, {time.Second, true}, {12 * time.Second, false}, {13 * time.Second, false}, {14 * time.Second, true}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newKillSwitch(cfg)
			for _, s := range tt.steps {
				k.record(t0.Add(s.at), s.failed)
			}
			if state, _, _ := k.current(); (state == switchTripped) != tt.trips {
				t.Errorf("state %v, want tripped: %v", state, tt.trips)
			}
		})
	}

	// Tripped, it waits RestartTimeout, probes, and backs off when the
	// probe fails; a probe that succeeds closes it and resets the count.
	k := newKillSwitch(cfg)
	for i := range 4 {
		k.record(t0.Add(time.Duration(i)*time.Millisecond), true)
	}
	_, resumeAt, _ := k.current()
	if want := t0.Add(3*time.Millisecond + time.Second); !resumeAt.Equal(want) {
		t.Errorf("resume at %v, want %v", resumeAt, want)
	}
	if k.probeDue(resumeAt.Add(-time.Millisecond)) || !k.probeDue(resumeAt) {
		t.Error("the probe is due exactly at the restart time")
	}
	k.record(resumeAt, true) // the probe fails
	if state, again, _ := k.current(); state != switchTripped || !again.Equal(resumeAt.Add(2*time.Second)) {
		t.Errorf("after a failed probe: %v until %v, want tripped for twice the restart timeout", state, again)
	}
	_, again, _ := k.current()
	k.probeDue(again)
	k.record(again, false)
	if state, _, _ := k.current(); state != switchClosed || k.trips != 0 {
		t.Errorf("after a good probe: %v with %d trips, want closed and reset", state, k.trips)
	}
	select {
	case <-k.probeDone:
	default:
		t.Error("a good probe does not signal the session")
	}

	// A connection lost while probing: the next session probes at once.
	for i := range 4 {
		k.record(again.Add(time.Duration(i)*time.Millisecond), true)
	}
	_, until, _ := k.current()
	k.probeDue(until)
	later := until.Add(time.Hour)
	if !k.resumeTripped(later) || !k.probeDue(later) {
		t.Error("a session after a probe cut short does not probe again at once")
	}
	k.record(later, false)
	if k.resumeTripped(later) {
		t.Error("a closed switch tells a new session it is tripped")
	}
}

// What counts as a failure for good, with and without IgnorePermanent.
func TestKillSwitchClassifiesOutcomes(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name            string
		failedFor, err  error
		settlement      middleware.Settlement
		ignorePermanent bool
		failed, counted bool
	}{
		{"handled", nil, nil, middleware.Ack, false, false, true},
		{"recovered after exhausted retries", &middleware.RetriesExhaustedError{Attempts: 3, Last: boom}, nil, middleware.Ack, false, true, true},
		{"requeued after a failure", nil, boom, middleware.Requeue, false, true, true},
		{"permanent, rejected", nil, middleware.Permanent(boom), middleware.Reject, false, true, true},
		{"permanent, ignored", nil, middleware.Permanent(boom), middleware.Reject, true, false, true},
		{"permanent, recovered, ignored", middleware.Permanent(boom), nil, middleware.Ack, true, false, true},
		{"released at shutdown", nil, &middleware.InterruptedError{Reason: context.Canceled}, middleware.Release, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &Listener{cfg: config{killSwitch: &KillSwitch{IgnorePermanent: tt.ignorePermanent}}}
			failed, counted := l.failedForGood(&delivery{failedFor: tt.failedFor}, tt.err, tt.settlement)
			if failed != tt.failed || counted != tt.counted {
				t.Errorf("failed %v, counted %v; want %v, %v", failed, counted, tt.failed, tt.counted)
			}
		})
	}
}
