package dlx_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/publisher"
)

// A fault at each step of a replay (the basic.get connection before the
// publish, the publisher frozen or cut before its confirm, the basic.get
// connection cut or frozen before the ack), half-way through 10 dead
// letters: the replay stops or goes on, and every message is on the work
// queue or still on the DLQ, the one caught in the fault on both at worst.
// A second replay then moves the rest.
func TestReplayUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault matrix of a minute or more: make test runs it in the newest broker's suite; the older brokers' suites run with -short")
	}
	t.Parallel() // each case has its own queues, proxies and connections
	for _, typ := range []dlx.QueueType{dlx.Classic, dlx.Quorum} {
		for _, f := range tierFaults {
			t.Run(fmt.Sprintf("%s/%s", typ, f.name), func(t *testing.T) {
				t.Parallel()
				replayUnderFault(t, typ, f)
			})
		}
	}
}

func replayUnderFault(t *testing.T, typ dlx.QueueType, f tierFault) {
	const n = 10
	topo := topology(t, dlx.Topology{Type: typ})
	declare(t, topo)
	deadLetters(t, topo, n)
	gproxy, gurl := brokertest.Proxy(t)
	pproxy, purl := brokertest.Proxy(t)
	p, err := publisher.New(purl, publisher.WithLogger(quiet), publisher.WithConfirmTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	later := background(t)
	pub := &faultAt{Publisher: p, n: n / 2}
	if f.before != nil {
		pub.before = func() { f.before(gproxy, pproxy, later) }
	}
	if f.after != nil {
		pub.after = func() { f.after(gproxy, pproxy, later) }
	}
	conn, err := amqp.DialConfig(gurl, amqp.Config{Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stats, err := dlx.Replay(ctx, ch, pub, topo.DLQ())
	t.Logf("first replay: %+v, %v", stats, err)
	// The fault ends. A healthy connection closes in order (its close-ok
	// follows the acks sent before it); then a frozen one is cut, so the
	// broker hands back at once what it holds unacked there instead of
	// after its heartbeat timeout, which a loaded machine stretched past
	// the wait below.
	_ = conn.Close()
	gproxy.CutAll()

	// What the fault left on the DLQ goes the same way, undisturbed.
	brokertest.Eventually(t, 10*time.Second, "the DLQ holds what the first replay did not ack", func() bool {
		return brokertest.Depth(t, topo.DLQ()) >= n-stats.Replayed
	})
	time.Sleep(time.Second) // a copy still on its way would show now
	again, err := dlx.Replay(context.Background(), brokertest.Channel(t, brokertest.Dial(t)), newPublisher(t), topo.DLQ())
	if err != nil {
		t.Fatalf("second replay: %+v, %v", again, err)
	}
	seen := map[string]int{}
	for _, d := range drain(t, topo.Queue) {
		seen[d.MessageId]++
	}
	copies := 0
	for i := range n {
		id := fmt.Sprint(i)
		copies += seen[id]
		if seen[id] == 0 {
			t.Errorf("message %s lost", id)
		}
	}
	if copies > n+1 {
		t.Errorf("%d copies of %d messages after one fault: more than one duplicate", copies, n)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != 0 {
		t.Errorf("the DLQ still holds %d", d)
	}
	t.Logf("%d copies of %d messages; second replay %+v", copies, n, again)
}
