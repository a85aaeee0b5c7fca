package publisher_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/publisher"
)

// Two "nodes" in front of the broker: when the publisher's node dies, it
// dials the other one at once, never the dead one first, and every publish
// from then on is confirmed through it; its log names the node it reached
// each time. (A publish caught in the dying connection may fail as not
// confirmed, as publisher/cut_test.go covers.)
func TestPublisherMovesToAnotherNodeWhenItsNodeDies(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	a, urlA := brokertest.Proxy(t)
	b, urlB := brokertest.Proxy(t)
	nodes := map[string]*faultproxy.Proxy{amqpurl.Redact(urlA): a, amqpurl.Redact(urlB): b}
	var logs testlog.Buffer
	p := newPublisher(t, urlA, publisher.WithURLs(urlB, urlA), publisher.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	first := loggedNode(t, logs.String(), "publisher: connected")
	if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{MessageId: "before"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // up long enough to count as a working node

	cut := time.Now()
	nodes[first].Refuse(true)
	nodes[first].CutAll()
	brokertest.Eventually(t, 10*time.Second, "reconnected", func() bool { return strings.Contains(logs.String(), "publisher: reconnected") })
	took := time.Since(cut)
	second := loggedNode(t, logs.String(), "publisher: reconnected")
	if second == first {
		t.Fatalf("reconnected to the dead node %s", first)
	}
	if attempts := nodes[first].Accepted(); attempts > 1 {
		t.Errorf("the dead node saw %d connection attempts, want only the first", attempts)
	}
	const n = 100
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Publish(ctxTimeout(t, 20*time.Second), "", q, amqp.Publishing{MessageId: fmt.Sprint(i)}); err != nil {
				t.Errorf("publish through %s: %v", second, err)
			}
		}()
	}
	wg.Wait()
	if got := brokertest.Depth(t, q); got != n+1 {
		t.Errorf("the queue holds %d messages, want the %d confirmed", got, n+1)
	}
	t.Logf("reconnected %v after the node died (%s -> %s)", took, first, second)
}

func loggedNode(t *testing.T, log, message string) string {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, message) {
			if _, url, ok := strings.Cut(line, "url="); ok {
				return strings.Fields(url)[0]
			}
		}
	}
	t.Fatalf("no %q line naming a node in:\n%s", message, log)
	return ""
}

func TestWithURLsNeedsOneUser(t *testing.T) {
	_, err := publisher.New("amqp://alice:hunter2@127.0.0.1:1/", publisher.WithURLs("amqp://bob:hunter2@127.0.0.1:2/"))
	if err == nil || !strings.Contains(err.Error(), `WithURLs: amqp://alice:xxxxx@127.0.0.1:1/ logs in as "alice" and amqp://bob:xxxxx@127.0.0.1:2/ as "bob"`) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("New = %v, want the two users named, passwords hidden", err)
	}
}
