package reliability

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// poisonChildEnv carries "queue,dlq,limit,consumers" to a child process
// running the listener of TestRedeliveryLimitEndsACrashLoop.
const poisonChildEnv = "AMQPRETRY_POISON_CHILD"

const poisonID = "poison"

// TestRedeliveryLimitEndsACrashLoop runs the listener in a child process
// (this test binary again) whose handler SIGKILLs the process when it gets
// one particular message, as an out-of-memory kill or a crash in cgo would:
// no Retry ever sees an error. The parent starts the child again each time it
// dies. With WithRedeliveryLimit(n) on a quorum queue, the n-th restart finds
// the message delivered n times before and sends it to the DLQ without
// running the handler: n deaths, then the message is on the DLQ with the
// reason, and every other message, many of which were in flight beside it at
// the first crash, was handled and none went to the DLQ.
func TestRedeliveryLimitEndsACrashLoop(t *testing.T) {
	if spec := os.Getenv(poisonChildEnv); spec != "" {
		runPoisonChild(t, spec)
		return
	}
	// Half the messages are there at the first start; the other half, the
	// poison among them, arrive once the child consumes at full prefetch,
	// so that its first death takes many messages in flight with it.
	const messages, poisonAt = 100, 75
	tests := []struct {
		name             string
		limit, consumers int
	}{
		{"limit 2, one consumer", 2, 1},
		{"limit 3, two consumers", 3, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
			brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum"})
			brokertest.Queue(t, dlq, nil)
			msgs := make([]amqp.Publishing, messages)
			for i := range msgs {
				id := strconv.Itoa(i)
				if i == poisonAt {
					id = poisonID
				}
				msgs[i] = amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent}
			}
			brokertest.Publish(t, q, msgs[:messages/2]...)

			// One channel for the DLQ's depth, read every 100ms.
			probe := brokertest.Channel(t, brokertest.Dial(t))
			dlqDepth := func() int {
				info, err := probe.QueueDeclarePassive(dlq, true, false, false, false, nil)
				if err != nil {
					t.Fatal(err)
				}
				return info.Messages
			}
			handled := map[string]bool{}
			returned := 0 // handled after a redelivery: in flight beside the poison at a death
			careful, published := false, false
			began := time.Now()
			deaths := 0
			for start := 1; ; start++ {
				if start > tt.limit+3 {
					t.Fatalf("the message still kills the process after %d restarts (limit %d); %d of %d others handled, DLQ holds %d",
						start-1, tt.limit, len(handled), messages-1, dlqDepth())
				}
				ch := startPoisonChild(t, fmt.Sprintf("%s,%s,%d,%d", q, dlq, tt.limit, tt.consumers))
				life, progress := time.Now(), time.Now()
				tick := time.NewTicker(100 * time.Millisecond)
				killed, done := false, false
				for !killed && !done {
					select {
					case line, ok := <-ch.lines:
						if !ok {
							killed = true
						} else if id, found := strings.CutPrefix(line, "handled "); found {
							id, again := strings.CutSuffix(id, " redelivered")
							if again && !handled[id] {
								returned++
							}
							handled[id] = true
							progress = time.Now()
						} else if strings.Contains(line, "starting with one consumer at prefetch 1") {
							careful = true
						}
						// The second half once the first is handled at full
						// speed (or at once, if the listener does not start
						// carefully).
						if start == 1 && !published && (strings.Contains(line, "consuming at full prefetch") || !careful && len(handled) == messages/2) {
							published = true
							brokertest.Publish(t, q, msgs[messages/2:]...)
						}
					case <-tick.C:
						n := dlqDepth()
						if n > 1 {
							ch.stop(t)
							t.Fatalf("start %d: the DLQ holds %d: messages in flight beside the poison went with it; %d of %d others handled",
								start, n, len(handled), messages-1)
						}
						done = n == 1 && len(handled) == messages-1
						if time.Since(progress) > 30*time.Second {
							ch.stop(t)
							t.Fatalf("start %d: nothing for 30s; %d of %d others handled, DLQ holds %d:\n%s", start, len(handled), messages-1, n, ch.output())
						}
					}
				}
				tick.Stop()
				if killed {
					err := ch.wait()
					if !strings.Contains(fmt.Sprint(err), "killed") {
						t.Fatalf("start %d: the child exited with %v, want killed by its handler:\n%s", start, err, ch.output())
					}
					deaths++
					t.Logf("start %d: killed after %v", start, time.Since(life).Round(time.Millisecond))
					continue
				}
				ch.stop(t)
				t.Logf("start %d: the poison on the DLQ and every other message handled after %v; %v since the first start",
					start, time.Since(life).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
				break
			}
			t.Logf("%d messages were in flight beside the poison at a death and handled after it", returned)
			if returned == 0 {
				t.Error("no message was in flight beside the poison when it killed the process: the test proves nothing about them")
			}
			// With several quorum consumers on one connection, RabbitMQ (3.10.8
			// and 4.0.5 alike) counts the deliveries of one of them twice when
			// the connection dies: a death at full speed may count 2. The
			// careful restarts have one consumer and count 1.
			fewest := tt.limit
			if tt.consumers > 1 {
				fewest = tt.limit - 1
			}
			if deaths < fewest || deaths > tt.limit {
				t.Errorf("the process died %d times, want %d to %d (WithRedeliveryLimit(%d))", deaths, fewest, tt.limit, tt.limit)
			}
			if n := brokertest.Depth(t, q); n != 0 {
				t.Errorf("the work queue still holds %d", n)
			}
			ch := brokertest.Channel(t, brokertest.Dial(t))
			d, ok := brokertest.Get(t, ch, dlq)
			if !ok || d.MessageId != poisonID {
				t.Fatalf("the DLQ's first message is %q (found: %v), want %q", d.MessageId, ok, poisonID)
			}
			if extra, ok := brokertest.Get(t, ch, dlq); ok {
				t.Errorf("the DLQ also holds %q: a message in flight beside the poison was dead-lettered with it", extra.MessageId)
			}
			checks := []struct {
				header string
				ok     func(any) bool
				want   string
			}{
				{"x-exception-message", func(v any) bool { s, _ := v.(string); return strings.Contains(s, "redelivery limit reached") }, "the reason"},
				{"x-amqpretry-error-type", func(v any) bool { return v == "*listener.RedeliveryLimitError" }, "*listener.RedeliveryLimitError"},
				{"x-amqpretry-attempts", func(v any) bool { n, ok := v.(int64); return ok && n >= int64(tt.limit) && n <= int64(tt.limit+1) },
					fmt.Sprintf("int64 %d or %d, the deliveries", tt.limit, tt.limit+1)},
				{"x-amqpretry-original-queue", func(v any) bool { return v == q }, q},
			}
			for _, c := range checks {
				if v := d.Headers[c.header]; !c.ok(v) {
					t.Errorf("%s = %#v, want %s", c.header, v, c.want)
				}
			}
		})
	}
}

// poisonChild is one run of the child process.
type poisonChild struct {
	cmd   *exec.Cmd
	lines chan string // its output, closed at EOF
	mu    sync.Mutex
	all   []string
	read  chan struct{} // closed when the output is read to the end
}

func startPoisonChild(t *testing.T, spec string) *poisonChild {
	t.Helper()
	c := &poisonChild{lines: make(chan string, 1024), read: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestRedeliveryLimitEndsACrashLoop$")
	c.cmd.Env = append(os.Environ(), poisonChildEnv+"="+spec)
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.Stderr = c.cmd.Stdout
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.read)
		defer close(c.lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			c.mu.Lock()
			c.all = append(c.all, s.Text())
			c.mu.Unlock()
			c.lines <- s.Text()
		}
	}()
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			_ = c.wait()
		}
	})
	return c
}

// wait reads the rest of the output and waits for the process.
func (c *poisonChild) wait() error {
	for range c.lines {
	}
	<-c.read
	return c.cmd.Wait()
}

// stop shuts the child down gracefully, as a deployment would.
func (c *poisonChild) stop(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan error, 1)
	go func() { exited <- c.wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the child's graceful shutdown ended with %v:\n%s", err, c.output())
		}
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-exited
		t.Fatalf("the child did not stop within 30s of SIGTERM:\n%s", c.output())
	}
}

func (c *poisonChild) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.all, "\n")
}

// runPoisonChild is the child: a listener whose handler kills the process on
// the poison message and prints every other one it handles.
func runPoisonChild(t *testing.T, spec string) {
	parts := strings.Split(spec, ",")
	q, dlq := parts[0], parts[1]
	limit, _ := strconv.Atoi(parts[2])
	consumers, _ := strconv.Atoi(parts[3])
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var out sync.Mutex // one line at a time on stdout
	var l *listener.Listener
	chain := middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(time.Millisecond)), middleware.Recover(recoverer.Republish(pub, "", dlq)))
	var poisoned atomic.Bool
	handle := func(_ context.Context, d *amqp.Delivery) error {
		if d.MessageId == poisonID {
			// The first time, die with deliveries in flight beside it, as
			// a busy consumer would: those the broker has sent since, which
			// the handlers beside it, slow from now on, have not got to (a
			// handler that hangs no longer stops its channel: the others
			// run on in the pool's other slots). On a careful restart, at
			// prefetch 1, none come.
			if !d.Redelivered {
				poisoned.Store(true)
				time.Sleep(500 * time.Millisecond)
			}
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
		if poisoned.Load() {
			time.Sleep(100 * time.Millisecond)
		}
		again := ""
		if d.Redelivered {
			again = " redelivered"
		}
		out.Lock()
		fmt.Println("handled " + d.MessageId + again)
		out.Unlock()
		return nil
	}
	l, err = listener.New(q, chain, handle,
		listener.WithURL(brokertest.URL()),
		listener.WithRedeliveryLimit(limit),
		listener.WithConcurrentConsumers(consumers),
		listener.WithLogger(slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelInfo}))))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Run(ctx); err != nil {
		t.Fatal(err)
	}
}
