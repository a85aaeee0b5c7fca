package amqphdr

import (
	"math"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Headers RabbitMQ sets when it dead-letters or redelivers a message, and the
// ones Spring AMQP's RepublishMessageRecoverer writes, which we write too so
// that Spring-side DLQ tools read our dead letters.
const (
	XDeath             = "x-death"
	XDeliveryCount     = "x-delivery-count"
	XFirstDeathQueue   = "x-first-death-queue" // the queue of the message's first dead-lettering
	OriginalExchange   = "x-original-exchange"
	OriginalRoutingKey = "x-original-routingKey"
)

// MaxCount bounds counts read from headers: anything larger is junk.
const MaxCount = 1 << 30

// IsBrokerOwned reports whether RabbitMQ owns the header: x-death,
// x-delivery-count, x-first-death-* and x-last-death-*. A copy of a message
// must not carry them (RabbitMQ 4 refuses client-written x-death, and stale
// counts mislead whoever reads the copy).
func IsBrokerOwned(name string) bool {
	return name == XDeath || name == XDeliveryCount ||
		strings.HasPrefix(name, "x-first-death-") || strings.HasPrefix(name, "x-last-death-")
}

// Count reads a count from a header value of any AMQP integer type, or a
// whole double (some clients write counts as doubles). ok is false for
// anything else, and for values outside [0, MaxCount].
func Count(v any) (n int, ok bool) {
	var x int64
	switch v := v.(type) {
	case int64:
		x = v
	case int32:
		x = int64(v)
	case int16:
		x = int64(v)
	case int8:
		x = int64(v)
	case int:
		x = int64(v)
	case uint8:
		x = int64(v)
	case uint16:
		x = int64(v)
	case uint32:
		x = int64(v)
	case float64:
		if math.IsNaN(v) || v != math.Trunc(v) {
			return 0, false
		}
		x = int64(math.Max(math.Min(v, MaxCount+1), -1))
	default:
		return 0, false
	}
	if x < 0 || x > MaxCount {
		return 0, false
	}
	return int(x), true
}

// DeliveryCount is the x-delivery-count a quorum queue sets on a redelivery:
// how often the message was delivered before, 0 when absent or junk.
func DeliveryCount(h amqp.Table) int {
	n, _ := Count(h[XDeliveryCount])
	return n
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
// fields of the wrong type are skipped, counts outside [0, MaxCount] read as
// 0: a malformed header gives fewer entries, never a panic.
func Deaths(h amqp.Table) []Death {
	raw, _ := h[XDeath].([]any)
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
		death.Count, _ = Count(t["count"])
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

// OriginalDestination is where the message in d was first published: Spring's
// x-original-exchange and x-original-routingKey when a recoverer wrote them,
// else the exchange and first routing key of its oldest death, else the
// delivery's own.
func OriginalDestination(d *amqp.Delivery) (exchange, key string) {
	if exchange, key, ok := FirstPublished(d.Headers); ok {
		return exchange, key
	}
	return d.Exchange, d.RoutingKey
}

// FirstPublished is where a message with headers h was first published, as
// its headers record it: Spring's x-original-exchange and
// x-original-routingKey when a recoverer wrote them, else the exchange and
// first routing key of its oldest x-death entry (a dead letter the broker
// made: a consumer's reject, an expiry, a limit). ok is false when neither
// says.
func FirstPublished(h amqp.Table) (exchange, key string, ok bool) {
	if ex, ok := h[OriginalExchange].(string); ok {
		if k, ok := h[OriginalRoutingKey].(string); ok {
			return ex, k, true
		}
	}
	if deaths := Deaths(h); len(deaths) > 0 {
		if first := deaths[len(deaths)-1]; len(first.RoutingKeys) > 0 {
			return first.Exchange, first.RoutingKeys[0], true
		}
	}
	return "", "", false
}

// UnreadableHeaders replaces, in what a framecheck-guarded connection
// delivers, a header table amqp091-go cannot parse; its value says why. The
// broker still holds the message with its own headers: hand it back, never
// republish this copy.
const UnreadableHeaders = "x-amqpretry-unreadable-headers"

// CC and BCC are RabbitMQ's sender-selected distribution headers: routing
// keys, besides the publish's own, that the broker routes a message to when
// it is published. A copy republished with them would be routed to them
// again on every hop, so copies leave them out, as RabbitMQ's own
// dead-lettering does.
const (
	CC  = "CC"
	BCC = "BCC"
)

// IsSenderRouting reports whether the header is CC or BCC.
func IsSenderRouting(name string) bool { return name == CC || name == BCC }
