package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// quorumDeadLetters is withDeadLetters on a quorum topology.
func quorumDeadLetters(t *testing.T, n int) dlx.Topology {
	t.Helper()
	topo := dlx.Topology{Queue: brokertest.Name(t, "work"), Type: dlx.Quorum}
	t.Cleanup(func() {
		brokertest.DeleteQueue(t, topo.Queue)
		brokertest.DeleteQueue(t, topo.DLQ())
	})
	if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
		t.Fatal(err)
	}
	return withDeadLettersOn(t, topo, n)
}

// dlq list, its connection cut in the middle of the look, 25 times: more
// than RabbitMQ 4's default delivery limit of 20, and each cut returns the
// messages taken so far, which 4.0 and 4.3 count. The quorum DLQ loses none
// of its dead letters.
func TestListCutMidPeekLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault test of many seconds: make test runs it in the newest broker's suite; the older brokers' suites run with -short")
	}
	const n = 5
	topo := quorumDeadLetters(t, n)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	proxy.SetLatency(20 * time.Millisecond)
	cut := 0
	for range 25 {
		consumes := proxy.Sent("basic.consume")
		done := make(chan int, 1)
		go func() {
			var stdout, stderr bytes.Buffer
			done <- run(context.Background(), []string{"dlq", "list", topo.DLQ(), "--url", url}, &stdout, &stderr)
		}()
		brokertest.Eventually(t, 10*time.Second, "the look consuming", func() bool { return proxy.Sent("basic.consume") > consumes })
		proxy.CutAll()
		if code := <-done; code != 0 {
			cut++
		}
		brokertest.Eventually(t, 10*time.Second, "every dead letter back on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == n })
	}
	if cut < 20 {
		t.Fatalf("only %d of 25 looks were cut before they ended: the test proves little", cut)
	}
	counts := map[string]any{}
	for _, d := range drainQueue(t, topo.DLQ()) {
		counts[d.MessageId] = d.Headers["x-delivery-count"]
	}
	t.Logf("%d looks cut; x-delivery-count by message: %v", cut, counts)
	if len(counts) != n {
		t.Errorf("%d dead letters left of %d", len(counts), n)
	}
}

// dlq list with its connection frozen in the middle of the look: the
// command gives up once the heartbeat says the broker is gone, and every
// dead letter is back on the DLQ once the connection ends.
func TestListFrozenMidPeekLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault test of many seconds: make test runs it in the newest broker's suite; the older brokers' suites run with -short")
	}
	const n = 5
	topo := quorumDeadLetters(t, n)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	proxy.SetLatency(20 * time.Millisecond)
	done := make(chan int, 1)
	var stdout, stderr bytes.Buffer
	go func() {
		done <- run(context.Background(), []string{"dlq", "list", topo.DLQ(), "--url", url}, &stdout, &stderr)
	}()
	brokertest.Eventually(t, 10*time.Second, "the look consuming", func() bool { return proxy.Sent("basic.consume") >= 1 })
	proxy.Blackhole(true)
	began := time.Now()
	select {
	case code := <-done:
		t.Logf("exit %d after %v: %s", code, time.Since(began).Round(time.Second), stderr.String())
		if code == 0 {
			t.Errorf("exit 0 on a frozen connection:\n%s", stdout.String())
		}
	case <-time.After(60 * time.Second):
		proxy.Blackhole(false)
		t.Fatal("dlq list hangs on a frozen connection")
	}
	proxy.Blackhole(false)
	brokertest.Eventually(t, 30*time.Second, "every dead letter back on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == n })
}

func drainQueue(t *testing.T, queue string) (out []amqp.Delivery) {
	t.Helper()
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for {
		d, ok := brokertest.Get(t, ch, queue)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}
