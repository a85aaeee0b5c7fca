package dlx

import (
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RetryCountHeader counts the broker-side retries a message has had. The
// tier recoverer writes it; RabbitMQ 4 ignores client-written x-death, so
// this header, not x-death, is the count of record.
const RetryCountHeader = "x-retry-count"

// maxCount bounds counts read from headers: anything larger is junk.
const maxCount = 1 << 30

// RetryCount returns how many broker-side retries d has had: the
// x-retry-count header when it holds a sane integer, otherwise the sum of
// the x-death counts for expiries (a retry queue's TTL running out). Junk of
// any kind counts as absent; it never panics.
func RetryCount(d *amqp.Delivery) int {
	if d == nil {
		return 0
	}
	if n, ok := count(d.Headers[RetryCountHeader]); ok {
		return n
	}
	total := 0
	for _, death := range Deaths(d) {
		if death.Reason == "expired" {
			total = min(total+death.Count, maxCount)
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

// Deaths reads the x-death header. Entries or fields of the wrong type are
// skipped, counts outside [0, 2^30] read as absent (0); a malformed header gives fewer
// entries, never a panic.
func Deaths(d *amqp.Delivery) []Death {
	if d == nil {
		return nil
	}
	raw, _ := d.Headers["x-death"].([]any)
	deaths := make([]Death, 0, len(raw))
	for _, e := range raw {
		t, ok := e.(amqp.Table)
		if !ok {
			continue
		}
		var death Death
		death.Queue, _ = t["queue"].(string)
		death.Reason, _ = t["reason"].(string)
		death.Exchange, _ = t["exchange"].(string)
		death.OriginalExpiration, _ = t["original-expiration"].(string)
		death.Count, _ = count(t["count"])
		death.Time, _ = t["time"].(time.Time)
		if keys, ok := t["routing-keys"].([]any); ok {
			for _, k := range keys {
				if s, ok := k.(string); ok {
					death.RoutingKeys = append(death.RoutingKeys, s)
				}
			}
		}
		deaths = append(deaths, death)
	}
	return deaths
}

// count reads an integer header value of any AMQP integer type.
func count(v any) (int, bool) {
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case int32:
		n = int64(x)
	case int16:
		n = int64(x)
	case int8:
		n = int64(x)
	case int:
		n = int64(x)
	case uint8:
		n = int64(x)
	case uint16:
		n = int64(x)
	case uint32:
		n = int64(x)
	case float64: // some clients write counts as doubles
		if math.IsNaN(x) || x != math.Trunc(x) {
			return 0, false
		}
		n = int64(math.Max(math.Min(x, maxCount+1), -1))
	default:
		return 0, false
	}
	if n < 0 || n > maxCount {
		return 0, false
	}
	return int(n), true
}
