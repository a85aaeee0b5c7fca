package publisher_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/publisher"
)

// The broker closes the publisher's connection twice while 8 goroutines
// publish. Every Publish must either fail or succeed after a real confirm,
// and every success must be on the queue. A message whose confirm was lost
// with the connection is published again, so the queue may hold a duplicate
// of it: that is counted and reported, never a loss.
func TestConnectionClosedByBrokerMidStream(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	name := brokertest.Name(t, "publisher")
	p := newPublisher(t, brokertest.URL(), publisher.WithConnectionName(name))

	const workers, perWorker = 8, 500
	var succeeded sync.Map
	var failures atomic.Int64
	var published atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				id := fmt.Sprintf("%d-%d", w, i)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := p.Publish(ctx, "", q, amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id)})
				cancel()
				published.Add(1)
				if err != nil {
					failures.Add(1)
					t.Logf("publish %s: %v", id, err)
					continue
				}
				succeeded.Store(id, true)
			}
		}()
	}

	cuts := 0
	for _, at := range []int64{workers * perWorker / 4, workers * perWorker * 2 / 3} {
		brokertest.Eventually(t, 30*time.Second, "publishing to progress", func() bool { return published.Load() >= at })
		cuts += brokertest.CloseConnections(t, name)
	}
	wg.Wait()
	if cuts < 2 {
		t.Fatalf("closed %d connections, want 2: the test did not cut anything", cuts)
	}

	onQueue := map[string]int{}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for {
		d, ok := brokertest.Get(t, ch, q)
		if !ok {
			break
		}
		onQueue[d.MessageId]++
	}
	missing, duplicates, failedButStored, strangers := 0, 0, 0, 0
	succeeded.Range(func(id, _ any) bool {
		if onQueue[id.(string)] == 0 {
			missing++
			t.Errorf("message %s was confirmed but is not on the queue", id)
		}
		return true
	})
	for id, n := range onQueue {
		if _, ok := succeeded.Load(id); !ok {
			failedButStored++
		}
		var w, i int
		if _, err := fmt.Sscanf(id, "%d-%d", &w, &i); err != nil || w >= workers || i >= perWorker {
			strangers++
		}
		duplicates += n - 1
	}
	t.Logf("%d publishes, %d confirmed, %d failed, %d connections cut; on the queue: %d distinct, %d duplicates, %d failed-but-stored",
		workers*perWorker, workers*perWorker-int(failures.Load()), failures.Load(), cuts, len(onQueue), duplicates, failedButStored)
	if missing > 0 || strangers > 0 {
		t.Fatalf("%d confirmed messages lost, %d unknown messages on the queue", missing, strangers)
	}
}
