package publisher_test

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/publisher"
)

// lockedBuffer is a log a test reads while the publisher writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Two "nodes" in front of the broker: when the publisher's node dies, every
// publish still gets its confirm through the other one, which the publisher
// dials first, at once; its log names the node it reached each time.
func TestPublisherMovesToAnotherNodeWhenItsNodeDies(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	a, urlA := brokertest.Proxy(t)
	b, urlB := brokertest.Proxy(t)
	nodes := map[string]*faultproxy.Proxy{amqpurl.Redact(urlA): a, amqpurl.Redact(urlB): b}
	var logs lockedBuffer
	p := newPublisher(t, urlA, publisher.WithURLs(urlB, urlA), publisher.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	first := loggedNode(t, logs.String(), "publisher: connected")
	time.Sleep(1100 * time.Millisecond) // up long enough to count as a working node

	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- p.Publish(ctxTimeout(t, 20*time.Second), "", q, amqp.Publishing{MessageId: string(rune('a' + i%26))})
		}()
		if i == n/2 {
			nodes[first].Refuse(true)
			nodes[first].CutAll()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("publish: %v", err)
		}
	}
	brokertest.Eventually(t, 10*time.Second, "reconnected", func() bool { return strings.Contains(logs.String(), "publisher: reconnected") })
	if second := loggedNode(t, logs.String(), "publisher: reconnected"); second == first {
		t.Errorf("reconnected to the dead node %s", first)
	}
	if attempts := nodes[first].Accepted(); attempts > 1 {
		t.Errorf("the dead node saw %d connection attempts, want only the first", attempts)
	}
	if got := brokertest.Depth(t, q); got < n {
		t.Errorf("the queue holds %d messages, want at least the %d confirmed", got, n)
	}
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
