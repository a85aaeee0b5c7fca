package listener_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// sacChildEnv carries the queue and its type to the child process of
// TestSingleActiveConsumerFailover.
const sacChildEnv = "AMQPRETRY_SAC_CHILD"

// sacTopology is the single-active-consumer layout the failover test
// declares, in the parent and the child alike; deleted when the test ends.
func sacTopology(t *testing.T, queue string, typ dlx.QueueType) dlx.Topology {
	topo := dlx.Topology{Queue: queue, Type: typ, SingleActiveConsumer: true}
	if os.Getenv(sacChildEnv) == "" {
		t.Cleanup(func() { deleteTopology(brokertest.URL(), topo) })
	}
	return topo
}

// Two processes consume a single-active-consumer queue, each a listener
// with one consumer at prefetch 1: the one that started first works, the
// other stands by (the broker lists it as waiting). The active one is
// killed (SIGKILL) in the middle of a message; the standby takes over with
// that message, then the rest in order: every message handled, in queue
// order on each side, the one in the dead process's hands handled twice at
// most, none lost.
func TestSingleActiveConsumerFailover(t *testing.T) {
	t.Parallel()
	if v := os.Getenv(sacChildEnv); v != "" {
		runSACChild(t, v)
		return
	}
	const total, killAt = 300, 100
	for _, typ := range []dlx.QueueType{dlx.Classic, dlx.Quorum} {
		t.Run(string(typ), func(t *testing.T) {
			q := brokertest.Name(t, "orders")
			sacTopology(t, q, typ)
			cmd := exec.Command(os.Args[0], "-test.run=^TestSingleActiveConsumerFailover$")
			cmd.Env = append(os.Environ(), sacChildEnv+"="+q+","+string(typ)+","+strconv.Itoa(killAt))
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = cmd.Stdout
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			var mu sync.Mutex
			var childSaw []int
			var childOut []string
			ready, held := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(exited)
				s := bufio.NewScanner(out)
				for s.Scan() {
					line := s.Text()
					mu.Lock()
					childOut = append(childOut, line)
					if id, ok := strings.CutPrefix(line, "handling "); ok {
						n, _ := strconv.Atoi(id)
						childSaw = append(childSaw, n)
					}
					mu.Unlock()
					switch {
					case line == "ready":
						close(ready)
					case strings.HasPrefix(line, "holding "):
						close(held)
					}
				}
			}()
			killed := false
			kill := func() {
				if !killed {
					killed = true
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
					<-exited
				}
			}
			defer kill()
			output := func() string { mu.Lock(); defer mu.Unlock(); return strings.Join(childOut, "\n") }
			select {
			case <-ready:
			case <-time.After(30 * time.Second):
				kill()
				t.Fatalf("the child did not start consuming:\n%s", output())
			}

			var standbyMu sync.Mutex
			var standby []int
			r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error {
				n, _ := strconv.Atoi(d.MessageId)
				standbyMu.Lock()
				standby = append(standby, n)
				standbyMu.Unlock()
				return nil
			}, listener.WithDeclare(sacTopology(t, q, typ).Declare), listener.WithPrefetch(1), listener.WithConsumerTagPrefix("standby"))
			brokertest.Eventually(t, 10*time.Second, "the standby registered", func() bool { return r.Stats().Consumers == 1 })
			activity := func() map[string]string {
				m := map[string]string{}
				for _, row := range listConsumers(t, q) {
					m[strings.SplitN(row.tag, "-", 2)[0]] = row.activity
				}
				return m
			}
			brokertest.Eventually(t, 20*time.Second, "the broker to list the child single_active and the standby waiting", func() bool {
				listed := activity()
				return listed["child"] == "single_active" && listed["standby"] == "waiting"
			})

			publishRange(t, q, 0, total)
			select {
			case <-held:
			case <-time.After(30 * time.Second):
				t.Fatalf("the child did not reach message %d:\n%s", killAt, output())
			}
			standbyMu.Lock()
			before := len(standby)
			standbyMu.Unlock()
			if before != 0 {
				t.Fatalf("the standby handled %d messages while the child was active", before)
			}
			kill()
			brokertest.Eventually(t, 30*time.Second, "the standby to handle the rest", func() bool {
				standbyMu.Lock()
				defer standbyMu.Unlock()
				return len(standby) > 0 && standby[len(standby)-1] == total-1
			})
			brokertest.Eventually(t, 10*time.Second, "the queue empty", func() bool { return brokertest.Depth(t, q) == 0 && r.Stats().InFlight == 0 })

			mu.Lock()
			child := slices.Clone(childSaw)
			mu.Unlock()
			standbyMu.Lock()
			took := slices.Clone(standby)
			standbyMu.Unlock()
			if !slices.Equal(child, span(0, len(child))) {
				t.Errorf("the child handled %v, want 0 to %d in order", child, len(child)-1)
			}
			if len(took) == 0 || !slices.Equal(took, span(took[0], total)) {
				t.Fatalf("the standby handled %v, want a run in order up to %d", took, total-1)
			}
			if first, last := took[0], child[len(child)-1]; first > last+1 || first < last {
				t.Errorf("the child's last message was %d and the standby's first %d: want the one in the child's hands (%d) handled again, and none skipped", last, first, last)
			}
			t.Logf("the child handled 0-%d and was killed holding %d; the standby handled %d-%d", child[len(child)-1], killAt, took[0], total-1)
		})
	}
}

// runSACChild is the child process of TestSingleActiveConsumerFailover: a
// listener that prints each message it handles and holds the one at
// holdAt until the parent kills it.
func runSACChild(t *testing.T, v string) {
	parts := strings.Split(v, ",")
	queue, typ := parts[0], dlx.QueueType(parts[1])
	holdAt, _ := strconv.Atoi(parts[2])
	topo := sacTopology(t, queue, typ)
	l, err := listener.New(queue, nil, func(ctx context.Context, d *amqp.Delivery) error {
		fmt.Println("handling", d.MessageId)
		if d.MessageId == strconv.Itoa(holdAt) {
			fmt.Println("holding", d.MessageId)
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, listener.WithURL(brokertest.URL()), listener.WithDeclare(topo.Declare), listener.WithPrefetch(1), listener.WithConsumerTagPrefix("child"),
		logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		if l.WaitReady(ctx) == nil {
			fmt.Println("ready")
		}
	}()
	_ = l.Run(ctx)
}

// peakConsumers samples the listener's handlers at a time (Stats'
// Consumers) and channels from now until the messages are handled, and
// returns the most of each it saw; publish runs while it samples.
func peakConsumers(t *testing.T, r *running, s *seen, total int, publish func()) (consumers, channels int) {
	t.Helper()
	done := make(chan struct{})
	peak := make(chan [2]int, 1)
	go func() {
		var most [2]int
		defer func() { peak <- most }()
		for {
			st := r.Stats()
			most[0], most[1] = max(most[0], st.Consumers), max(most[1], st.Channels)
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	publish()
	deadline := time.Now().Add(60 * time.Second)
	for s.distinct() < total && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(done)
	most := <-peak
	if s.distinct() < total {
		t.Fatalf("%d of %d handled after 60s", s.distinct(), total)
	}
	return most[0], most[1]
}

// A listener that declares its queue with single active consumer knows
// that more consumers add nothing there: it warns once, and under a backlog
// that would grow it to its maximum elsewhere, it stays at one consumer.
func TestSingleActiveDeclaredNeverScalesUp(t *testing.T) {
	t.Parallel()
	for _, typ := range []dlx.QueueType{dlx.Classic, dlx.Quorum} {
		t.Run(string(typ), func(t *testing.T) {
			topo := dlx.Topology{Queue: brokertest.Name(t, "orders"), Type: typ, SingleActiveConsumer: true}
			t.Cleanup(func() { deleteTopology(brokertest.URL(), topo) })
			var log testlog.Buffer
			s := newSeen()
			const total = 150 // 3s of work for one consumer: a dozen scaling looks
			r := start(t, topo.Queue, nil, func(_ context.Context, d *amqp.Delivery) error {
				time.Sleep(20 * time.Millisecond)
				s.add(d.MessageId)
				return nil
			}, listener.WithDeclare(topo.Declare), listener.WithMaxConcurrentConsumers(4), listener.WithPrefetch(10), listener.WithLogger(log.Logger()))
			brokertest.Eventually(t, 10*time.Second, "the listener consuming", func() bool { return r.Stats().Consumers == 1 })
			if peak, channels := peakConsumers(t, r, s, total, func() { publishN(t, topo.Queue, total) }); peak != 1 || channels != 1 {
				t.Errorf("the listener grew to %d handlers at a time on %d channels on a single-active-consumer queue it declared, want 1 on 1", peak, channels)
			}
			if n := log.Count("declared with single active consumer"); n != 1 {
				t.Errorf("the warning was logged %d times, want once:\n%s", n, log.String())
			}
		})
	}
}

// A queue declared elsewhere with single active consumer, consumed at
// prefetch 1 so that the channel working is always full: the listener's
// second channel gets nothing while the other works and messages are
// ready; it says so once, runs one handler at a time (the queue's order)
// and opens no more channels (without that it would grow to its maximum,
// each new channel as idle as the last). The same listener on an ordinary
// queue grows to its maximum and says nothing.
func TestSingleActiveObservedStopsScaling(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		typ       dlx.QueueType
		sac       bool
		wantPeak  int
		wantWarns int
	}{
		{"classic", dlx.Classic, true, 1, 1},
		{"quorum", dlx.Quorum, true, 1, 1},
		{"classic without single active consumer", dlx.Classic, false, 4, 0},
		{"quorum without single active consumer", dlx.Quorum, false, 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var log testlog.Buffer
			s := newSeen()
			q := brokertest.Name(t, "q")
			brokertest.Queue(t, q, amqp.Table{"x-queue-type": string(tc.typ), "x-single-active-consumer": tc.sac})
			const total = 200 // 4s of work for one consumer
			r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error {
				time.Sleep(20 * time.Millisecond)
				s.add(d.MessageId)
				return nil
			}, listener.WithMaxConcurrentConsumers(4), listener.WithPrefetch(1), listener.WithIdleTimeout(500*time.Millisecond), listener.WithLogger(log.Logger()))
			brokertest.Eventually(t, 10*time.Second, "the listener consuming", func() bool { return r.Stats().Consumers == 1 })
			peak, channels := peakConsumers(t, r, s, total, func() { publishN(t, q, total) })
			if peak != tc.wantPeak {
				t.Errorf("the listener peaked at %d handlers at a time, want %d", peak, tc.wantPeak)
			}
			if tc.sac && channels != 2 {
				t.Errorf("the listener peaked at %d channels on a single-active queue, want its 2", channels)
			}
			if n := log.Count("delivers to one consumer at a time"); n != tc.wantWarns {
				t.Errorf("the warning was logged %d times, want %d:\n%s", n, tc.wantWarns, log.String())
			}
			brokertest.Eventually(t, 10*time.Second, "back to one consumer", func() bool { return r.Stats().Consumers == 1 })
		})
	}
}
