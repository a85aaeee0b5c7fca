package listener_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// Readiness goes false the moment shutdown begins, while handlers still
// drain (Kubernetes stops routing to a pod that is stopping), and the log
// says when draining began and what the stop did.
func TestReadinessEndsWhenShutdownBegins(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	var running, finished atomic.Bool
	release := make(chan struct{})
	handle := func(context.Context, *amqp.Delivery) error {
		running.Store(true)
		<-release // a handler that finishes its work whatever the context says
		finished.Store(true)
		return nil
	}
	var log testlog.Buffer
	r := start(t, q, nil, handle, listener.WithLogger(log.Logger()))
	var releaseOnce sync.Once
	freeHandler := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(freeHandler) // before start's Stop, which waits for the handler
	if err := r.WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "m"})
	brokertest.Eventually(t, 10*time.Second, "the handler running", running.Load)
	r.cancel()
	brokertest.Eventually(t, 5*time.Second, "readiness false after the cancel", func() bool { return !r.Stats().Ready })
	if finished.Load() {
		t.Error("readiness went false only after the handler finished: a probe kept routing to a listener that was stopping")
	}
	freeHandler()
	r.Stop(t)
	if log.Count("listener: draining") != 1 || log.Count("listener: stopped") != 1 || log.Count("handled=1") != 1 {
		t.Errorf("the log does not say the listener drained and stopped, with what it handled:\n%s", log.String())
	}
}
