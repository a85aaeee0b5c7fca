package listener_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// When the connection dies under a running handler, the handler's context is
// cancelled at once, and its failure never reaches the recoverer: the broker
// has already requeued the message.
func TestDeadChannelCancelsItsHandlers(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "m"})
	name := brokertest.Name(t, "listener")
	started := make(chan struct{}, 10)
	cancelledAt := make(chan time.Time, 10)
	start(t, q, middleware.Chain(middleware.Retry(3), middleware.Recover(neverRecover(t))), func(ctx context.Context, _ *amqp.Delivery) error {
		started <- struct{}{}
		select {
		case <-ctx.Done():
			cancelledAt <- time.Now()
			return ctx.Err()
		case <-time.After(20 * time.Second):
			return errors.New("never cancelled")
		}
	}, listener.WithConnectionName(name))
	<-started
	// The clock starts when the close is done: rabbitmqctl itself can take
	// seconds to start on a loaded machine, before it closes anything.
	brokertest.CloseConnections(t, name)
	closed := time.Now()
	select {
	case at := <-cancelledAt:
		if d := at.Sub(closed); d > 2*time.Second {
			t.Errorf("the handler's context was cancelled %v after the connection was closed", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context was not cancelled when its channel died")
	}
}

// Shutdown with many deliveries in backoff: they are requeued, and none of
// them runs again in this listener.
func TestShutdownDoesNotReprocessWhatItRequeues(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 200)
	var calls, late atomic.Int64
	var stopping atomic.Bool
	r := start(t, q, middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(time.Minute), middleware.WithMaxInterval(time.Minute)), middleware.Recover(neverRecover(t))),
		func(context.Context, *amqp.Delivery) error {
			calls.Add(1)
			if stopping.Load() {
				late.Add(1)
			}
			return errors.New("down")
		}, listener.WithConcurrentConsumers(10), listener.WithPrefetch(50))
	brokertest.Eventually(t, 10*time.Second, "all 200 in backoff", func() bool { return calls.Load() == 200 })
	stopping.Store(true)
	r.Stop(t)
	if n := late.Load(); n != 0 {
		t.Errorf("%d handler runs started after shutdown began", n)
	}
	if n := brokertest.Depth(t, q); n != 200 {
		t.Errorf("queue holds %d, want all 200 requeued", n)
	}
}

// A handler whose last attempt fails during the shutdown grace period: the
// message is requeued, not sent to the DLQ.
func TestShutdownNeverRecovers(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "m"})
	started := make(chan struct{})
	r := start(t, q, middleware.Chain(middleware.Retry(1), middleware.Recover(neverRecover(t))), func(context.Context, *amqp.Delivery) error {
		close(started)
		time.Sleep(300 * time.Millisecond)
		return errors.New("failed while shutting down")
	})
	<-started
	r.Stop(t)
	if n := brokertest.Depth(t, q); n != 1 {
		t.Fatalf("queue holds %d, want the message requeued", n)
	}
}

func TestCancelDuringDial(t *testing.T) {
	brokertest.Dial(t)
	proxy, url := brokertest.Proxy(t)
	proxy.Blackhole(true) // connects, never answers the handshake
	defer proxy.Blackhole(false)
	l, err := listener.New("q", nil, func(context.Context, *amqp.Delivery) error { return nil }, listener.WithURL(url), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	begin := time.Now()
	if err := l.Run(ctx); err != nil || time.Since(begin) > 2*time.Second {
		t.Fatalf("Run = %v after %v, want nil soon after the cancel", err, time.Since(begin))
	}
}

func TestNothingRunsWhenCancelledBeforeRun(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 100)
	var calls atomic.Int64
	l, err := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { calls.Add(1); return nil },
		listener.WithURL(brokertest.URL()), listener.WithConcurrentConsumers(20), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Run(ctx); err != nil || calls.Load() != 0 {
		t.Fatalf("Run = %v with %d handler calls, want nil and none", err, calls.Load())
	}
}

// A goroutine left behind by a handler calls WillWait after the handler returned:
// no second reader appears, and Run still returns.
func TestLateWillWaitStartsNoSecondReader(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 5)
	parked := make(chan struct{})
	var once atomic.Bool
	r := start(t, q, nil, func(ctx context.Context, _ *amqp.Delivery) error {
		if once.CompareAndSwap(false, true) {
			go func() {
				time.Sleep(100 * time.Millisecond)
				chainrun.WillWait(ctx)
				close(parked)
			}()
		}
		return nil
	}, listener.WithConcurrentConsumers(1))
	<-parked
	brokertest.Eventually(t, 5*time.Second, "all handled", func() bool { return r.Stats().Handled == 5 })
	if took := r.Stop(t); took > 5*time.Second {
		t.Errorf("shutdown took %v", took)
	}
}

func TestRunReturnsNilWhenCancelledDuringAFailure(t *testing.T) {
	brokertest.Dial(t)
	ctx, cancel := context.WithCancel(context.Background())
	l, _ := listener.New("q", nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(brokertest.URL()), logTo(t, false),
		listener.WithDeclare(func(*amqp.Channel) error { cancel(); return errors.New("transient") }))
	if err := l.Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil: its context was cancelled", err)
	}
}

func TestConsumerCountsAreBounded(t *testing.T) {
	h := func(context.Context, *amqp.Delivery) error { return nil }
	for _, opts := range [][]listener.Option{
		{listener.WithMaxConcurrentConsumers(math.MaxInt)},
		{listener.WithConcurrentConsumers(5000)},
	} {
		_, err := listener.New("q", nil, h, opts...)
		if err == nil || !strings.Contains(err.Error(), "1000") {
			t.Errorf("New = %v, want a bound of 1000 consumers", err)
		}
	}
}
