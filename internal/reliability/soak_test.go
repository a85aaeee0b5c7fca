//go:build disruptive

package reliability

import (
	"context"
	"errors"
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

// TestSoakZeroLoss: every message ends handled or on the DLQ, whatever
// happens to the connections and the broker meanwhile. make test runs 20,000
// messages; make soak sets AMQPRETRY_SOAK_MESSAGES higher.
func TestSoakZeroLoss(t *testing.T) {
	messages := envInt("AMQPRETRY_SOAK_MESSAGES", 20000)
	brokertest.Dial(t)
	topo := dlx.Topology{Queue: brokertest.Name(t, "soak")}
	t.Cleanup(func() { brokertest.DeleteQueue(t, topo.Queue); brokertest.DeleteQueue(t, topo.DLQ()) })
	if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
		t.Fatal(err)
	}
	// Three roads to the broker, each through a proxy that cuts it: the
	// source's, the listener's, and the dead-letter publisher's.
	var proxies []*faultproxy.Proxy
	via := func() string {
		p, url := brokertest.Proxy(t)
		proxies = append(proxies, p)
		return url
	}
	quiet := newLogBook().logger()
	source, err := publisher.New(via(), publisher.WithLogger(quiet), publisher.WithHeartbeat(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer source.Close()
	deadLetters, err := publisher.New(via(), publisher.WithLogger(quiet), publisher.WithHeartbeat(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer deadLetters.Close()

	var mu sync.Mutex
	handled, dead := map[string]int{}, map[string]int{}
	handle := func(ctx context.Context, d *amqp.Delivery) error {
		switch fateOf(d.MessageId) {
		case transient:
			if middleware.Attempt(ctx) == 1 {
				return errors.New("transient")
			}
		case permanent:
			return middleware.Permanent(errors.New("permanent"))
		case panics:
			panic("boom")
		}
		mu.Lock()
		handled[d.MessageId]++
		mu.Unlock()
		return nil
	}
	work, err := listener.New(topo.Queue,
		middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(10*time.Millisecond), middleware.WithMaxInterval(100*time.Millisecond)),
			middleware.Recover(recoverer.Republish(deadLetters, topo.DLX(), topo.DLQRoutingKey(), recoverer.WithPublishTimeout(10*time.Second)))),
		handle, listener.WithURL(via()), listener.WithConcurrentConsumers(1), listener.WithMaxConcurrentConsumers(4),
		listener.WithPrefetch(50), listener.WithHeartbeat(2*time.Second), listener.WithRequeueDelay(50*time.Millisecond, time.Second),
		listener.WithIdleTimeout(2*time.Second), listener.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	// The DLQ is read directly, not through a proxy: it only counts.
	dlqReader, _ := listener.New(topo.DLQ(), nil, func(_ context.Context, d *amqp.Delivery) error {
		mu.Lock()
		dead[d.MessageId]++
		mu.Unlock()
		return nil
	}, listener.WithURL(brokertest.URL()), listener.WithLogger(quiet))

	begin := time.Now()
	accepted := make([]int, len(proxies)) // connections so far: the faults must force new ones
	for i, p := range proxies {
		accepted[i] = p.Accepted()
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, l := range []*listener.Listener{work, dlqReader} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Run(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			wg.Wait()
		}
	}
	defer stop()

	// The source publishes every id until the broker confirms it: a publish
	// that fails with the connection is sent again (a duplicate, at worst).
	var confirmed atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < messages && ctx.Err() == nil; i++ {
			id := fmt.Sprint(i)
			for ctx.Err() == nil {
				pctx, pcancel := context.WithTimeout(ctx, 15*time.Second)
				err := source.Publish(pctx, "", topo.Queue, amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id)})
				pcancel()
				if err == nil {
					confirmed.Add(1)
					break
				}
			}
		}
	}()

	// Faults: every proxy cuts its connections every ~2s; once, at about a
	// third of the way, the broker's app stops for a few seconds.
	cuts, restarts := 0, 0
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled)+len(dead) == messages
	}
	restarted := false
	deadline := time.Now().Add(time.Duration(messages)*5*time.Millisecond + 3*time.Minute)
	for tick := time.NewTicker(2 * time.Second); !done(); {
		if time.Now().After(deadline) {
			mu.Lock()
			nh, nd := len(handled), len(dead)
			mu.Unlock() // Fatalf runs the deferred stop, which waits for handlers that take mu
			t.Fatalf("not done after %v: %d handled, %d dead of %d (%d confirmed)", time.Since(begin), nh, nd, messages, confirmed.Load())
		}
		<-tick.C
		for _, p := range proxies {
			p.CutAll()
		}
		cuts++
		if !restarted && confirmed.Load() > int64(messages/3) {
			restarted = true
			restartBrokerApp(t)
			restarts++
		}
	}
	took := time.Since(begin)
	// Let stragglers (a redelivery, a late dead letter) arrive before judging,
	// then stop everything: the maps no longer change.
	time.Sleep(2 * time.Second)
	stop()
	if restarts != 1 {
		t.Errorf("the broker was restarted %d times, want once", restarts)
	}
	for i, p := range proxies {
		if p.Accepted() <= accepted[i] {
			t.Errorf("proxy %d saw no new connection: the cuts were not felt", i)
		}
	}
	for _, q := range []string{topo.Queue, topo.DLQ()} {
		if n := brokertest.Depth(t, q); n != 0 {
			t.Errorf("%s still holds %d messages", q, n)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	wrong, dupHandled, dupDead := 0, 0, 0
	for i := range messages {
		id := fmt.Sprint(i)
		f := fateOf(id)
		inHandled, inDead := handled[id] > 0, dead[id] > 0
		switch {
		case !inHandled && !inDead:
			t.Errorf("message %s lost", id)
		case (f == permanent || f == panics) && (!inDead || inHandled):
			wrong++
			t.Errorf("message %s (fate %d) should be on the DLQ only: handled %d, dead %d", id, f, handled[id], dead[id])
		case (f == healthy || f == transient) && (!inHandled || inDead):
			wrong++
			t.Errorf("message %s (fate %d) should be handled only: handled %d, dead %d", id, f, handled[id], dead[id])
		}
		dupHandled += max(handled[id]-1, 0)
		dupDead += max(dead[id]-1, 0)
	}
	t.Logf("%d messages in %v: %d handled, %d dead-lettered, 0 lost; faults: %d rounds of connection cuts (3 proxies), %d broker restart; duplicates: %d handled twice, %d dead-lettered twice",
		messages, took.Round(time.Millisecond), len(handled), len(dead), cuts, restarts, dupHandled, dupDead)
}

// restartBrokerApp stops the broker's app for a few seconds, as a broker
// restart or a failover would, and always starts it again.
func restartBrokerApp(t *testing.T) {
	t.Helper()
	started := false
	start := func() {
		if !started {
			started = true
			if _, err := brokertest.Ctl("start_app"); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(start) // restored even if the test fails
	if _, err := brokertest.Ctl("stop_app"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	start()
}
