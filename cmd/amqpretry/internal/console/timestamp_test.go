package console

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A timestamp far past 2262 (a producer that wrote milliseconds, as Node's
// Date.now() does, is in the year 56,000) does not fit UnixNano: two such
// messages that differ only in it must still have different keys, or an
// action on one would act on the other (issue 41, item 8).
func TestKeyOfFarTimestamps(t *testing.T) {
	const dateNow = 1732670000123
	a := amqp.Delivery{Body: []byte("same"), Timestamp: time.Unix(dateNow, 0)}
	b := amqp.Delivery{Body: []byte("same"), Timestamp: time.Unix(dateNow+1<<55, 0)} // UnixNano wraps to the same value
	if Key(&a) == Key(&b) {
		t.Errorf("messages with timestamps %v and %v share the key %s", a.Timestamp, b.Timestamp, Key(&a))
	}
}
