package listener

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

func TestKillSwitchStateMachine(t *testing.T) {
	cfg := KillSwitch{TripThreshold: 0.5, ActivationThreshold: 4, TrackingPeriod: 10 * time.Second, RestartTimeout: time.Second, MaxRestartTimeout: 3 * time.Second}
	t0 := time.Unix(1_000_000, 0)
	type step struct {
		at time.Duration // since t0
		o  outcome
	}
	tests := []struct {
		name  string
		steps []step
		trips bool
	}{
		{"below the activity threshold", []step{{0, failed}, {time.Second, failed}, {2 * time.Second, failed}}, false},
		{"at the trip threshold", []step{{0, succeeded}, {time.Second, failed}, {2 * time.Second, succeeded}, {3 * time.Second, failed}}, true},
		{"below the trip threshold", []step{{0, succeeded}, {time.Second, failed}, {2 * time.Second, succeeded}, {3 * time.Second, succeeded}, {4 * time.Second, failed}}, false},
		{"old failures slide out", []step{{0, failed}, {time.Second, failed}, {12 * time.Second, succeeded}, {13 * time.Second, succeeded}, {14 * time.Second, failed}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newKillSwitch(cfg)
			for _, s := range tt.steps {
				k.record(t0.Add(s.at), s.o)
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
		k.record(t0.Add(time.Duration(i)*time.Millisecond), failed)
	}
	_, resumeAt, _ := k.current()
	if want := t0.Add(3*time.Millisecond + time.Second); !resumeAt.Equal(want) {
		t.Errorf("resume at %v, want %v", resumeAt, want)
	}
	if k.probeDue(resumeAt.Add(-time.Millisecond)) || !k.probeDue(resumeAt) {
		t.Error("the probe is due exactly at the restart time")
	}
	k.record(resumeAt, ignored) // a bad message decides nothing
	if state, _, _ := k.current(); state != switchProbing {
		t.Errorf("after an ignored failure while probing: %v, want still probing", state)
	}
	k.record(resumeAt, failed) // the probe fails
	if state, again, _ := k.current(); state != switchTripped || !again.Equal(resumeAt.Add(2*time.Second)) {
		t.Errorf("after a failed probe: %v until %v, want tripped for twice the restart timeout", state, again)
	}
	_, again, _ := k.current()
	k.probeDue(again)
	k.record(again, succeeded)
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
		k.record(again.Add(time.Duration(i)*time.Millisecond), failed)
	}
	_, until, _ := k.current()
	k.probeDue(until)
	later := until.Add(time.Hour)
	if !k.resumeTripped(later) || !k.probeDue(later) {
		t.Error("a session after a probe cut short does not probe again at once")
	}
	k.record(later, succeeded)
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
		settlement      chainrun.Settlement
		ignorePermanent bool
		o               outcome
		counted         bool
	}{
		{"handled", nil, nil, chainrun.Ack, false, succeeded, true},
		{"recovered after exhausted retries", &middleware.RetriesExhaustedError{Attempts: 3, Last: boom}, nil, chainrun.Ack, false, failed, true},
		{"requeued after a failure", nil, boom, chainrun.Requeue, false, failed, true},
		{"permanent, rejected", nil, middleware.Permanent(boom), chainrun.Reject, false, failed, true},
		{"permanent, ignored", nil, middleware.Permanent(boom), chainrun.Reject, true, ignored, true},
		{"permanent, recovered, ignored", middleware.Permanent(boom), nil, chainrun.Ack, true, ignored, true},
		{"released at shutdown", nil, &middleware.InterruptedError{Reason: context.Canceled}, chainrun.Release, false, succeeded, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &Listener{cfg: config{killSwitch: &KillSwitch{IgnorePermanent: tt.ignorePermanent}}}
			dd := &delivery{}
			if tt.failedFor != nil {
				dd.fate = &recovery{failedFor: tt.failedFor}
			}
			o, counted := l.classify(dd, tt.err, tt.settlement)
			if o != tt.o || counted != tt.counted {
				t.Errorf("outcome %v, counted %v; want %v, %v", o, counted, tt.o, tt.counted)
			}
		})
	}
}
