package listener_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// Two "nodes" (proxies in front of the broker): when the one the listener is
// connected to dies, the listener dials the other at once, not after a
// backoff and not the dead one first, and the log names each node reached.
// In order, the dead node is the first URL: dialing it first would show.
func TestListenerMovesToAnotherNodeWhenItsNodeDies(t *testing.T) {
	t.Parallel()
	t.Run("shuffled", func(t *testing.T) { testMovesToAnotherNode(t) })
	t.Run("in order", func(t *testing.T) { testMovesToAnotherNode(t, listener.WithURLsInOrder()) })
}

func testMovesToAnotherNode(t *testing.T, opts ...listener.Option) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	a, urlA := brokertest.Proxy(t)
	b, urlB := brokertest.Proxy(t)
	nodes := map[string]*faultproxy.Proxy{amqpurl.Redact(urlA): a, amqpurl.Redact(urlB): b}
	var logs testlog.Buffer
	s := newSeen()
	r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(d.MessageId); return nil },
		append(opts, listener.WithURLs(urlA, urlB), listener.WithLogger(logs.Logger()))...)
	brokertest.Eventually(t, 10*time.Second, "consuming", func() bool { return brokertest.Consumers(t, q) == 1 })
	first := connectedTo(t, &logs, 1)
	time.Sleep(1100 * time.Millisecond) // up long enough to count as a working node

	dead := nodes[first]
	dead.Refuse(true) // the node is gone: its connections cut, new ones refused
	dead.CutAll()
	cut := time.Now()
	brokertest.Eventually(t, 10*time.Second, "consuming again", func() bool {
		return strings.Count(logs.String(), "listener: connected") == 2 && brokertest.Consumers(t, q) == 1
	})
	resumed := time.Since(cut)
	second := connectedTo(t, &logs, 2)
	if second == first {
		t.Fatalf("reconnected to the dead node %s", first)
	}
	if refused := dead.Accepted(); refused > 1 {
		t.Errorf("the dead node saw %d connection attempts, want only the first: the other node comes first", refused)
	}
	publishN(t, q, 20)
	brokertest.Eventually(t, 10*time.Second, "the messages handled through the other node", func() bool { return s.distinct() == 20 })
	r.Stop(t)
	t.Logf("consuming again %v after the node died (%s -> %s)", resumed, first, second)
}

// connectedTo returns the node named by the n-th "listener: connected" line.
func connectedTo(t *testing.T, logs *testlog.Buffer, n int) string {
	t.Helper()
	var lines []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "listener: connected") {
			lines = append(lines, line)
		}
	}
	if len(lines) < n {
		t.Fatalf("%d connections logged, want %d:\n%s", len(lines), n, logs.String())
	}
	_, url, ok := strings.Cut(lines[n-1], "url=")
	if !ok {
		t.Fatalf("the log does not name the node: %s", lines[n-1])
	}
	return strings.Fields(url)[0]
}
