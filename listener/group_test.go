package listener_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
)

// connectionsNamed counts the broker's connections whose client-provided
// name contains name.
func connectionsNamed(t *testing.T, name string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(brokertest.Rabbitmqctl(t, "list_connections", "client_properties"), "\n") {
		if strings.Contains(line, `{"connection_name","`) && strings.Contains(line, name) {
			n++
		}
	}
	return n
}

// groupOf makes n listeners on fresh queues, each handling into seen.
func groupOf(t *testing.T, n int, s *seen, opts ...listener.Option) ([]*listener.Listener, []string) {
	t.Helper()
	var ls []*listener.Listener
	var qs []string
	for i := range n {
		q := brokertest.Name(t, fmt.Sprint("q", i))
		brokertest.Queue(t, q, nil)
		l, err := listener.New(q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(q + "/" + d.MessageId); return nil },
			append([]listener.Option{logTo(t, false), listener.WithConcurrentConsumers(2)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		ls, qs = append(ls, l), append(qs, q)
	}
	return ls, qs
}

// Five listeners in a group hold one connection between them (the broker's
// connection list shows it), each with its own consumers; a cut reconnects
// all five, once; WaitReady waits for all.
func TestGroupSharesOneConnectionAndReconnectsTogether(t *testing.T) {
	s := newSeen()
	ls, qs := groupOf(t, 5, s)
	proxy, url := brokertest.Proxy(t)
	name := brokertest.Name(t, "group")
	g, err := listener.NewGroup(ls, listener.WithURL(url), listener.WithConnectionName(name), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	wait, stop := context.WithTimeout(context.Background(), 15*time.Second)
	defer stop()
	if err := g.WaitReady(wait); err != nil {
		t.Fatal(err)
	}
	if n := connectionsNamed(t, name); n != 1 {
		t.Errorf("the broker shows %d connections named %s, want 1", n, name)
	}
	for _, q := range qs {
		if n := brokertest.Consumers(t, q); n != 2 {
			t.Errorf("%s has %d consumers, want 2", q, n)
		}
		publishN(t, q, 3)
	}
	brokertest.Eventually(t, 10*time.Second, "every message handled", func() bool { return s.distinct() == 15 })

	dialsBefore := proxy.Accepted()
	proxy.CutAll()
	brokertest.Eventually(t, 5*time.Second, "not ready after the cut", func() bool { return !ls[0].Stats().Ready })
	if err := g.WaitReady(wait); err != nil {
		t.Fatal(err)
	}
	if dials := proxy.Accepted() - dialsBefore; dials != 1 {
		t.Errorf("the group dialled %d times after one cut, want once for all five", dials)
	}
	for _, q := range qs {
		brokertest.Publish(t, q, amqp.Publishing{MessageId: "after-the-cut"})
	}
	brokertest.Eventually(t, 10*time.Second, "every message handled after the cut", func() bool { return s.distinct() == 20 })
}

// The first error that would end one listener's Run ends the group's: the
// others shut down gracefully, and Run returns it.
func TestGroupReturnsTheFirstFatalError(t *testing.T) {
	s := newSeen()
	ls, _ := groupOf(t, 2, s)
	missing, err := listener.New(brokertest.Name(t, "missing"), nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithMissingQueueFatal(), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	g, err := listener.NewGroup(append(ls, missing), listener.WithURL(brokertest.URL()), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = g.Run(ctx)
	if !errors.Is(err, listener.ErrQueueNotFound) || ctx.Err() != nil {
		t.Fatalf("Run = %v, want ErrQueueNotFound at once", err)
	}
	for _, l := range ls {
		if err := l.WaitReady(context.Background()); !errors.Is(err, listener.ErrQueueNotFound) {
			t.Errorf("a listener of the group: WaitReady = %v, want the group's error", err)
		}
	}
}

func TestNewGroupRefusesWhatItCannotUse(t *testing.T) {
	s := newSeen()
	ls, _ := groupOf(t, 1, s)
	tests := []struct {
		listeners []*listener.Listener
		opts      []listener.Option
		want      string
	}{
		{nil, nil, "at least one listener"},
		{[]*listener.Listener{ls[0], ls[0]}, nil, "twice"},
		{ls, []listener.Option{listener.WithPrefetch(10)}, "WithPrefetch belongs to each listener's New"},
		{ls, []listener.Option{listener.WithURL("http://nope")}, "WithURL"},
	}
	for _, tt := range tests {
		if _, err := listener.NewGroup(tt.listeners, tt.opts...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewGroup = %v, want %q", err, tt.want)
		}
	}
}

// brokerConnectionMemory is the memory the broker spends on connections and
// channels (readers, writers, channels, other), in bytes.
func brokerConnectionMemory(t *testing.T) int64 {
	t.Helper()
	out := brokertest.Rabbitmqctl(t, "eval", "M = rabbit_vm:memory(), lists:sum([proplists:get_value(K, M, 0) || "+
		"K <- [connection_readers, connection_writers, connection_channels, connection_other]]).")
	var n int64
	if _, err := fmt.Sscan(strings.TrimSpace(out), &n); err != nil {
		t.Fatalf("broker memory: %q: %v", out, err)
	}
	return n
}

// What a group saves, 20 listeners grouped or each on its own connection:
// connections (and their reconnect loops), the client's heap and goroutines,
// the broker's memory for connections and channels. Logged, and asserted
// only for the connection count: figures for docs/services.md.
func TestGroupOfTwentyAgainstTwentyConnections(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a measurement")
	}
	const n = 20
	measure := func(grouped bool) (conns int, heapKiB uint64, goroutines int, brokerKiB int64) {
		name := brokertest.Name(t, fmt.Sprint("grouped-", grouped))
		ls, _ := groupOf(t, n, newSeen(), listener.WithURL(brokertest.URL()), listener.WithConnectionName(name))
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		g0, b0 := runtime.NumGoroutine(), brokerConnectionMemory(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, n)
		runs := n
		if grouped {
			g, err := listener.NewGroup(ls, listener.WithURL(brokertest.URL()), listener.WithConnectionName(name))
			if err != nil {
				t.Fatal(err)
			}
			runs = 1
			go func() { done <- g.Run(ctx) }()
		} else {
			for _, l := range ls {
				go func() { done <- l.Run(ctx) }()
			}
		}
		for _, l := range ls {
			if err := l.WaitReady(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		conns, goroutines = connectionsNamed(t, name), runtime.NumGoroutine()-g0
		heapKiB, brokerKiB = (after.HeapInuse-min(before.HeapInuse, after.HeapInuse))/1024, (brokerConnectionMemory(t)-b0)/1024
		cancel()
		for range runs {
			<-done
		}
		return conns, heapKiB, goroutines, brokerKiB
	}
	gc, gh, gg, gb := measure(true)
	lc, lh, lg, lb := measure(false)
	t.Logf("20 listeners, 2 consumers each: grouped %d connection, %d KiB client heap, %d goroutines, %d KiB broker connection memory; "+
		"each on its own: %d connections, %d KiB, %d goroutines, %d KiB", gc, gh, gg, gb, lc, lh, lg, lb)
	if gc != 1 || lc != n {
		t.Errorf("connections: grouped %d (want 1), alone %d (want %d)", gc, lc, n)
	}
}

// A group's connection freezes while one listener is opening its consumers
// and the other consumes: the group's Run returns within a few seconds of
// the shutdown, as a lone listener's does, rather than when the heartbeat
// gives up (15 s before the fix).
func TestGroupShutdownWhileOpeningAConsumerOnAFrozenConnectionIsBounded(t *testing.T) {
	t.Parallel()
	s := newSeen()
	ls, qs := groupOf(t, 1, s)
	proxy, url := brokertest.Proxy(t)
	defer proxy.Blackhole(false)
	release, frozen := make(chan struct{}), make(chan struct{})
	stuck := stuckInSetup(t, release, 20*time.Second, func() { proxy.Blackhole(true); close(frozen) })
	cancel, done := runGroup(t, append(ls, stuck), listener.WithURL(url))
	brokertest.Eventually(t, 10*time.Second, "the other listener consuming", func() bool { return brokertest.Consumers(t, qs[0]) == 2 })
	close(release)
	<-frozen
	time.Sleep(200 * time.Millisecond) // the stuck listener waits for its first channel now
	stopsWithin(t, cancel, done, 4*time.Second, "while a listener of the group opens a consumer on a frozen connection")
}

// At the shutdown one listener of a group is slow in its declaration (4 s)
// and another is still running a handler (2 s): the connection is not
// abandoned under the one that drains, though the setup has been waiting
// longer than the half second that marks it as stuck, and the delivery is
// acked on it when its handler returns.
func TestGroupShutdownLetsAListenerDrainBeforeAbandoningAStuckSetup(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "draining")
	brokertest.Queue(t, q, nil)
	running := make(chan struct{})
	var once sync.Once
	draining, err := listener.New(q, nil, func(context.Context, *amqp.Delivery) error {
		once.Do(func() { close(running) })
		time.Sleep(2 * time.Second) // past the shutdown, which gives it 5 s
		return nil
	}, logTo(t, false), listener.WithShutdownTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	stuck := stuckInSetup(t, nil, 4*time.Second, nil)
	cancel, done := runGroup(t, []*listener.Listener{draining, stuck}, listener.WithURL(brokertest.URL()))
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "slow"})
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start")
	}
	cancel()
	err = <-done
	done <- err // for the cleanup
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := brokertest.Depth(t, q); n != 0 {
		t.Errorf("the queue holds %d: the delivery that drained was not acked (the connection was abandoned under it)", n)
	}
}

// runGroup runs a Group of ls until cancel, or the test's end; Run's
// result comes on done, where a reader puts it back for the test's cleanup.
func runGroup(t *testing.T, ls []*listener.Listener, opts ...listener.Option) (cancel context.CancelFunc, done chan error) {
	t.Helper()
	g, err := listener.NewGroup(ls, append([]listener.Option{logTo(t, false)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return cancel, done
}

// stuckInSetup is a listener on a fresh queue whose declaration waits for
// release, or at most hold, then calls then, if not nil: a listener of a
// group stuck opening its consumers.
func stuckInSetup(t *testing.T, release <-chan struct{}, hold time.Duration, then func()) *listener.Listener {
	t.Helper()
	q := brokertest.Name(t, "stuck")
	brokertest.Queue(t, q, nil)
	var once sync.Once
	l, err := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		logTo(t, false), listener.WithConcurrentConsumers(2), listener.WithDeclare(func(*amqp.Channel) error {
			timer := time.NewTimer(hold)
			defer timer.Stop()
			select {
			case <-release:
			case <-timer.C:
			}
			if then != nil {
				once.Do(then)
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	return l
}
