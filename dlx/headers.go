package dlx

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
)

// RetryCountHeader counts the broker-side retries a message has had. The
// tier recoverer writes it; RabbitMQ 4 ignores client-written x-death, so
// this header, not x-death, is the count of record.
const RetryCountHeader = "x-retry-count"

// RetryCount returns how many broker-side retries d has had: the
// x-retry-count header when it holds a sane integer, otherwise the sum of
// the x-death counts for expiries (a retry queue's TTL running out). Junk of
// any kind counts as absent; it never panics.
func RetryCount(d *amqp.Delivery) int {
	if d == nil {
		return 0
	}
	if n, ok := amqphdr.Count(d.Headers[RetryCountHeader]); ok {
		return n
	}
	total := 0
	for _, death := range Deaths(d) {
		if death.Reason == "expired" {
			total = min(total+death.Count, amqphdr.MaxCount)
		}
	}
	return total
}

// Death is one entry of the x-death header RabbitMQ adds each time it
// dead-letters a message: one per (queue, reason), with a count.
type Death struct {
	Queue              string
	Reason             string // rejected, expired, maxlen, delivery_limit
	Count              int
	Exchange           string
	RoutingKeys        []string
	Time               time.Time
	OriginalExpiration string
}

// Deaths reads the x-death header, most recent death first. Entries or
// fields of the wrong type are skipped, counts outside [0, 2^30] read as
// absent (0); a malformed header gives fewer entries, never a panic.
func Deaths(d *amqp.Delivery) []Death {
	if d == nil {
		return nil
	}
	read := amqphdr.Deaths(d.Headers)
	deaths := make([]Death, len(read))
	for i, death := range read {
		deaths[i] = Death(death)
	}
	return deaths
}
