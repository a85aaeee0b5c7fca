package chainrun_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// fakeAcknowledger records settlements instead of talking to a broker.
type fakeAcknowledger struct {
	calls []string
	err   error
}

func (f *fakeAcknowledger) Ack(tag uint64, multiple bool) error {
	f.calls = append(f.calls, fmt.Sprintf("ack(%d, multiple=%v)", tag, multiple))
	return f.err
}

func (f *fakeAcknowledger) Nack(tag uint64, multiple, requeue bool) error {
	f.calls = append(f.calls, fmt.Sprintf("nack(%d, multiple=%v, requeue=%v)", tag, multiple, requeue))
	return f.err
}

func (f *fakeAcknowledger) Reject(tag uint64, requeue bool) error {
	f.calls = append(f.calls, fmt.Sprintf("reject(%d, requeue=%v)", tag, requeue))
	return f.err
}

func TestSettle(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want chainrun.Settlement
		call string
	}{
		{"handled", nil, chainrun.Ack, "ack(7, multiple=false)"},
		{"plain error", errBoom, chainrun.Requeue, "reject(7, requeue=true)"},
		{"exhausted", &middleware.RetriesExhaustedError{Attempts: 5, Last: errBoom}, chainrun.Requeue, "reject(7, requeue=true)"},
		{"permanent", middleware.Permanent(errBoom), chainrun.Reject, "reject(7, requeue=false)"},
		{"wrapped permanent", fmt.Errorf("x: %w", middleware.Permanent(errBoom)), chainrun.Reject, "reject(7, requeue=false)"},
		{"panic", &middleware.PanicError{Value: "x"}, chainrun.Requeue, "reject(7, requeue=true)"},
		{"interrupted", &middleware.InterruptedError{Reason: context.Canceled, Last: middleware.Permanent(errBoom)}, chainrun.Release, "nack(7, multiple=false, requeue=true)"},
		{"a handler's own cancellation", fmt.Errorf("query: %w", context.Canceled), chainrun.Requeue, "reject(7, requeue=true)"},
		{"exhausted on a cancellation", &middleware.RetriesExhaustedError{Attempts: 3, Last: context.Canceled}, chainrun.Requeue, "reject(7, requeue=true)"},
		{"permanent cancellation", middleware.Permanent(fmt.Errorf("query: %w", context.Canceled)), chainrun.Reject, "reject(7, requeue=false)"},
		{"rejected cancellation", fmt.Errorf("%w; handler error: %w", middleware.ErrReject, context.Canceled), chainrun.Reject, "reject(7, requeue=false)"},
		{"failed recovery of a cancellation", &middleware.RecoveryError{Err: errors.New("nacked"), Cause: context.Canceled}, chainrun.Requeue, "reject(7, requeue=true)"},
		{"a handler's own deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), chainrun.Requeue, "reject(7, requeue=true)"},
		{"recoverer asked to reject", fmt.Errorf("%w; handler error: %w", middleware.ErrReject, errBoom), chainrun.Reject, "reject(7, requeue=false)"},
		{"a failed recovery beats reject", &middleware.RecoveryError{Err: errors.New("nacked"), Cause: middleware.ErrReject}, chainrun.Requeue, "reject(7, requeue=true)"},
		{"interrupted beats reject", &middleware.InterruptedError{Reason: context.Canceled, Last: middleware.ErrReject}, chainrun.Release, "nack(7, multiple=false, requeue=true)"},
		{"interrupted beats a failed recovery", &middleware.InterruptedError{Reason: middleware.ErrInterrupted, Last: &middleware.RecoveryError{Err: errors.New("nacked"), Cause: errBoom}}, chainrun.Release, "nack(7, multiple=false, requeue=true)"},
		{"recovery failed", &middleware.RecoveryError{Err: errors.New("nacked"), Cause: middleware.Permanent(errBoom)}, chainrun.Requeue, "reject(7, requeue=true)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ack := &fakeAcknowledger{}
			got, err := chainrun.Settle(&amqp.Delivery{Acknowledger: ack, DeliveryTag: 7}, tt.err)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want || len(ack.calls) != 1 || ack.calls[0] != tt.call {
				t.Errorf("Settle = %v with calls %v, want %v with [%s]", got, ack.calls, tt.want, tt.call)
			}
		})
	}
}

func TestSettleReportsChannelErrors(t *testing.T) {
	ack := &fakeAcknowledger{err: amqp.ErrClosed}
	_, err := chainrun.Settle(&amqp.Delivery{Acknowledger: ack, DeliveryTag: 9}, nil)
	if !errors.Is(err, amqp.ErrClosed) || err.Error() != "chainrun: ack of delivery 9 failed: Exception (504) Reason: \"channel/connection is not open\"" {
		t.Fatalf("err = %v", err)
	}
}

func TestSettlementString(t *testing.T) {
	for s, want := range map[chainrun.Settlement]string{chainrun.Ack: "ack", chainrun.Reject: "reject", chainrun.Requeue: "requeue", chainrun.Release: "release", 0: "Settlement(0)"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", s, s.String(), want)
		}
	}
}
