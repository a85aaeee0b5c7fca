package outbox

import (
	"context"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// roomyPublisher is an async publisher with room for so many in flight.
type roomyPublisher struct{ room int }

func (roomyPublisher) Publish(context.Context, string, string, amqp.Publishing) error {
	panic("not called")
}

func (roomyPublisher) PublishAsync(context.Context, string, string, amqp.Publishing, func(error)) error {
	panic("not called")
}

func (p roomyPublisher) MaxInFlight() int { return p.room }

// A worker's publishes under way stay within its share of the publisher's
// room for async publishes (WithMaxInFlight): a publish that had to wait
// for room would start with its timeout already running, and hold the
// worker up meanwhile.
func TestAWorkersPublishesKeepWithinThePublishersRoom(t *testing.T) {
	for _, c := range []struct {
		room, workers, batch, concurrency, want int
	}{
		{room: 1024, workers: 2, batch: 500, want: 500},
		{room: 1024, workers: 3, batch: 500, want: 341},
		{room: 1024, workers: 2, batch: 1000, want: 512},
		{room: 1024, workers: 2, batch: 500, concurrency: 10, want: 10},
		{room: 3, workers: 1, batch: 500, concurrency: 10, want: 3},
		{room: 1, workers: 4, batch: 500, want: 1},
	} {
		t.Run(fmt.Sprintf("room %d, %d workers, batch %d, concurrency %d", c.room, c.workers, c.batch, c.concurrency), func(t *testing.T) {
			r := &Relay{async: roomyPublisher{c.room}, cfg: config{workers: c.workers, batchSize: c.batch, concurrency: c.concurrency}}
			w := r.startWorker(context.Background(), context.Background())
			defer w.stop()
			if w.limit != c.want || cap(w.slots) != c.want {
				t.Errorf("a worker has %d slots (limit %d), want %d", cap(w.slots), w.limit, c.want)
			}
		})
	}
}
