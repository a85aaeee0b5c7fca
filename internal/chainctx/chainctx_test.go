package chainctx_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/chainctx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type hook struct{ calls int }

func (h *hook) WillWait() { h.calls++ }

// keyed answers for WaitHookKey in its own Value, as the listener's
// per-delivery context does.
type keyed struct {
	context.Context
	h *hook
}

func (k keyed) Value(key any) any {
	if key == chainctx.WaitHookKey {
		return k.h
	}
	return k.Context.Value(key)
}

func TestValuesRoundTrip(t *testing.T) {
	ctx := context.Background()
	if chainctx.Queue(ctx) != "" || chainctx.Interrupt(ctx) != nil {
		t.Fatal("an empty context should carry no queue and no interrupt")
	}
	chainctx.WillWait(ctx) // no hook: nothing happens, nothing panics

	interrupt := make(chan struct{})
	h := &hook{}
	ctx = chainctx.WithWaitHook(chainctx.WithInterrupt(chainctx.WithQueue(ctx, "orders"), interrupt), h)
	if got := chainctx.Queue(ctx); got != "orders" {
		t.Errorf("Queue = %q", got)
	}
	if chainctx.Interrupt(ctx) != (<-chan struct{})(interrupt) {
		t.Error("Interrupt did not return the channel given")
	}
	chainctx.WillWait(ctx)
	other := &hook{}
	chainctx.WillWait(keyed{context.Background(), other})
	if h.calls != 1 || other.calls != 1 {
		t.Errorf("WillWait reached the hook %d and the keyed hook %d times, want once each", h.calls, other.calls)
	}
}

// Retries report themselves as they are built, innermost first; an outer one
// multiplies what it wraps by its attempts.
func TestSurveyWaitNestsInBuildOrder(t *testing.T) {
	got := chainctx.SurveyWait(func() {
		chainctx.RetryBuilt(2*time.Second, 3) // inner: built first
		chainctx.RetryBuilt(time.Second, 2)   // outer: wraps it
	})
	if want := time.Second + 2*2*time.Second; got != want {
		t.Errorf("SurveyWait = %v, want %v", got, want)
	}
	if got := chainctx.SurveyWait(func() {}); got != 0 {
		t.Errorf("a chain without Retry: SurveyWait = %v, want 0", got)
	}
	chainctx.RetryBuilt(time.Hour, 5) // outside a survey: nobody counts it
	if got := chainctx.SurveyWait(func() { chainctx.RetryBuilt(time.Second, 2) }); got != time.Second {
		t.Errorf("a Retry built before the survey leaked into it: SurveyWait = %v, want 1s", got)
	}
	if got := chainctx.SurveyWait(func() {
		chainctx.RetryBuilt(time.Duration(1<<62), 4)
		chainctx.RetryBuilt(time.Duration(1<<62), 4)
	}); got != time.Duration(1<<63-1) {
		t.Errorf("huge waits: SurveyWait = %v, want the largest duration", got)
	}
}

// Retries built on other goroutines while a survey runs are not counted,
// and a survey may run inside another (a middleware constructor that calls
// listener.New).
func TestSurveyCountsOnlyItsOwnGoroutine(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				chainctx.RetryBuilt(time.Hour, 10)
			}
		}
	}()
	for range 200 {
		if got := chainctx.SurveyWait(func() { chainctx.RetryBuilt(time.Second, 2) }); got != time.Second {
			close(stop)
			<-done
			t.Fatalf("SurveyWait = %v with another goroutine building Retries, want 1s", got)
		}
	}
	close(stop)
	<-done
	var inner time.Duration
	outer := chainctx.SurveyWait(func() {
		chainctx.RetryBuilt(time.Second, 3)
		inner = chainctx.SurveyWait(func() { chainctx.RetryBuilt(time.Minute, 2) })
		chainctx.RetryBuilt(2*time.Second, 2)
	})
	if inner != time.Minute || outer != 2*time.Second+2*time.Second {
		t.Errorf("nested surveys: inner %v, outer %v; want 1m and 4s", inner, outer)
	}
}

// The first Recover built is the innermost, the one a handler's Permanent
// error reaches; one built outside a survey, or in a nested one, does not
// count.
func TestSurveyFindsTheInnermostRecoverer(t *testing.T) {
	tests := []struct {
		name  string
		build func()
		want  any
	}{
		{"none", func() { chainctx.RetryBuilt(time.Second, 2) }, nil},
		{"one", func() { chainctx.RecovererBuilt("dlq") }, "dlq"},
		{"inner first", func() {
			chainctx.RecovererBuilt("inner")
			chainctx.RetryBuilt(time.Second, 2)
			chainctx.RecovererBuilt("outer")
		}, "inner"},
		{"nested survey keeps its own", func() {
			chainctx.SurveyChain(func() { chainctx.RecovererBuilt("other chain") })
			chainctx.RecovererBuilt("mine")
		}, "mine"},
	}
	chainctx.RecovererBuilt("outside") // no survey: nobody counts it
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chainctx.SurveyChain(tt.build).Recoverer; got != tt.want {
				t.Errorf("Recoverer = %v, want %v", got, tt.want)
			}
		})
	}
}
