package reliability

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// childEnv carries the queues to a child process running the listener.
const childEnv = "AMQPRETRY_DEATH_CHILD"

// TestProcessDeath kills a process whose only message is waiting between
// retries (an hour to go). SIGTERM shuts it down gracefully: the message is
// requeued, not dead-lettered. SIGKILL gives it no chance: the broker
// requeues the message when the connection drops. Either way it is back on
// its queue and nowhere else.
func TestProcessDeath(t *testing.T) {
	if queues := os.Getenv(childEnv); queues != "" {
		runChild(t, queues)
		return
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
			brokertest.Queue(t, q, nil)
			brokertest.Queue(t, dlq, nil)
			brokertest.Publish(t, q, amqp.Publishing{MessageId: "precious", DeliveryMode: amqp.Persistent})

			cmd := exec.Command(os.Args[0], "-test.run=^TestProcessDeath$")
			cmd.Env = append(os.Environ(), childEnv+"="+q+","+dlq)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = cmd.Stdout
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waiting := make(chan struct{})
			var mu sync.Mutex
			var lines []string
			output := func() string { mu.Lock(); defer mu.Unlock(); return strings.Join(lines, "\n") }
			go func() {
				s := bufio.NewScanner(out)
				for s.Scan() {
					mu.Lock()
					lines = append(lines, s.Text())
					mu.Unlock()
					if strings.Contains(s.Text(), "waiting an hour for attempt 2") {
						close(waiting)
					}
				}
			}()
			select {
			case <-waiting:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("the child never reached its backoff:\n%s", output())
			}
			if brokertest.Depth(t, q) != 0 {
				t.Fatal("the message should be with the child, unacked")
			}
			begin := time.Now()
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case err = <-exited:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
				t.Fatalf("the child did not exit within 30s of %s:\n%s", sig, output())
			}
			t.Logf("%s: the child exited after %v (%v)", sig, time.Since(begin), err)
			if sig == syscall.SIGTERM && err != nil {
				t.Errorf("a SIGTERM should end in a graceful shutdown, exit 0: %v\n%s", err, output())
			}
			brokertest.Eventually(t, 10*time.Second, "the message back on its queue", func() bool { return brokertest.Depth(t, q) == 1 })
			if n := brokertest.Depth(t, dlq); n != 0 {
				t.Errorf("the DLQ holds %d: a process death must not dead-letter anything", n)
			}
		})
	}
}

// runChild is the child process: a listener on its queue whose handler fails
// and whose Retry waits an hour, until a signal ends it.
func runChild(t *testing.T, queues string) {
	q, dlq, _ := strings.Cut(queues, ",")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	chain := middleware.Chain(
		middleware.Retry(3, middleware.WithInitialInterval(time.Hour), middleware.WithMaxInterval(time.Hour),
			middleware.OnRetry(func(context.Context, middleware.RetryEvent) { fmt.Println("waiting an hour for attempt 2") })),
		middleware.Recover(recoverer.Republish(pub, "", dlq)),
	)
	l, err := listener.New(q, chain, func(context.Context, *amqp.Delivery) error { return errors.New("down") },
		listener.WithURL(brokertest.URL()), listener.WithConsumerTimeout(3*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Run(ctx); err != nil {
		t.Fatal(err)
	}
	fmt.Println("shut down")
}
