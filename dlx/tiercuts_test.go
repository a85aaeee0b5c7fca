package dlx_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// faultAt is a recoverer.Publisher that runs a fault before and after its
// n-th publish (1 for the first), and passes every publish on.
type faultAt struct {
	recoverer.Publisher
	n             int64
	calls         atomic.Int64
	before, after func()
}

func (f *faultAt) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	hit := f.calls.Add(1) == f.n
	if hit && f.before != nil {
		f.before()
	}
	err := f.Publisher.Publish(ctx, exchange, key, msg)
	if hit && f.after != nil {
		f.after()
	}
	return err
}

// background returns a function that runs f on a goroutine of its own,
// which the test waits for as it ends.
func background(t *testing.T) func(f func()) {
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	return func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
}

// tierFault is one fault at one step of a tier recovery: the republish (of
// the listener's message, through the publisher's connection), the wait for
// its confirm, the ack of the original on the listener's connection.
type tierFault struct {
	name          string
	before, after func(listener, pub *faultproxy.Proxy, later func(func()))
}

var tierFaults = []tierFault{
	{name: "listener cut before the republish", before: func(l, _ *faultproxy.Proxy, _ func(func())) { l.CutAll() }},
	{name: "publisher frozen past the publish timeout", before: func(_, p *faultproxy.Proxy, _ func(func())) { p.Blackhole(true) },
		after: func(_, p *faultproxy.Proxy, _ func(func())) { p.Blackhole(false) }},
	{name: "publisher cut after the broker stored the copy, before its confirm", before: func(_, p *faultproxy.Proxy, later func(func())) {
		p.SetLatency(300 * time.Millisecond) // the publish reaches the broker at 300ms, its confirm the publisher at 600ms
		later(func() {
			time.Sleep(450 * time.Millisecond)
			p.CutAll()
			p.SetLatency(0)
		})
	}},
	{name: "listener cut before the ack", after: func(l, _ *faultproxy.Proxy, _ func(func())) { l.CutAll() }},
	{name: "listener frozen across the ack", after: func(l, _ *faultproxy.Proxy, later func(func())) {
		l.Blackhole(true)
		later(func() {
			time.Sleep(4 * time.Second) // past two heartbeats of 1s: both sides give the connection up
			l.Blackhole(false)
		})
	}},
}

// A fault at each step of each recovery of a message that always fails,
// through two tiers to the DLQ: the message is never lost, reaches the DLQ
// only after both tiers (x-retry-count 2 on every copy there, never early),
// and is duplicated at most once by the one fault (at-least-once).
func TestTiersUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault matrix of a minute or more: make test runs it in the newest broker's suite; the older brokers' suites run with -short")
	}
	// Each case has its own queues, proxies and connections, and spends its
	// time waiting on the broker and on timers: the cases run side by side.
	t.Parallel()
	for _, typ := range []dlx.QueueType{dlx.Classic, dlx.Quorum} {
		for _, at := range []int64{1, 3} { // the republish to the first tier; to the DLQ
			for _, f := range tierFaults {
				t.Run(fmt.Sprintf("%s/publish %d/%s", typ, at, f.name), func(t *testing.T) {
					t.Parallel()
					tiersUnderFault(t, typ, at, f)
				})
			}
		}
	}
}

func tiersUnderFault(t *testing.T, typ dlx.QueueType, at int64, f tierFault) {
	delays := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}
	topo := topology(t, dlx.Topology{Type: typ, RetryDelays: delays})
	declare(t, topo)
	lproxy, lurl := brokertest.Proxy(t)
	pproxy, purl := brokertest.Proxy(t)
	p, err := publisher.New(purl, publisher.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	later := background(t)
	pub := &faultAt{Publisher: p, n: at}
	if f.before != nil {
		pub.before = func() { f.before(lproxy, pproxy, later) }
	}
	if f.after != nil {
		pub.after = func() { f.after(lproxy, pproxy, later) }
	}
	// The publish timeout is what "publisher frozen past the publish
	// timeout" waits out; shorter, a quorum queue's confirm under make
	// test's load could miss it, and the copy sent again is a duplicate no
	// fault made (ci13: 3 and 4 copies on the DLQ).
	tiers := topo.Tiers(pub, dlx.WithRepublishOptions(recoverer.WithPublishTimeout(3*time.Second)))

	var mu sync.Mutex
	arrivals := map[int]int{} // x-retry-count → arrivals with it
	l, err := listener.New(topo.Queue, middleware.Recover(tiers), func(_ context.Context, d *amqp.Delivery) error {
		mu.Lock()
		arrivals[dlx.RetryCount(d)]++
		mu.Unlock()
		return fmt.Errorf("boom")
	}, listener.WithURL(lurl), listener.WithLogger(quiet), listener.WithHeartbeat(time.Second),
		listener.WithRequeueDelay(50*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "m", Body: []byte("x"), DeliveryMode: amqp.Persistent})

	others := []string{topo.Queue, topo.RetryQueue(delays[0]), topo.RetryQueue(delays[1])}
	settled := func() bool {
		if brokertest.Depth(t, topo.DLQ()) == 0 {
			return false
		}
		for _, q := range others {
			if brokertest.Depth(t, q) != 0 {
				return false
			}
		}
		return l.Stats().InFlight == 0
	}
	brokertest.Eventually(t, 40*time.Second, "the message on the DLQ and nowhere else", settled)
	time.Sleep(2 * time.Second) // a copy still on its way would show now
	brokertest.Eventually(t, 20*time.Second, "the message on the DLQ and nowhere else, still", settled)

	dead := drain(t, topo.DLQ())
	mu.Lock()
	seen := fmt.Sprint(arrivals)
	mu.Unlock()
	t.Logf("arrivals by x-retry-count: %s; %d on the DLQ", seen, len(dead))
	if len(dead) > 2 {
		t.Errorf("%d copies on the DLQ after one fault, want 1 or 2", len(dead))
	}
	for _, d := range dead {
		if d.Headers[dlx.RetryCountHeader] != int64(2) || d.Headers[recoverer.HeaderExceptionMessage] != "boom" {
			t.Errorf("a copy on the DLQ with x-retry-count %v and x-exception-message %v, want 2 and boom",
				d.Headers[dlx.RetryCountHeader], d.Headers[recoverer.HeaderExceptionMessage])
		}
	}
}
