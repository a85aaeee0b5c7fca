package publisher

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A table as published against the same table as amqp091 reads it back in a
// basic.return: widths and precision may change, values may not.
func TestSameTable(t *testing.T) {
	now := time.Unix(1_700_000_000, 123_456_789)
	tests := []struct {
		name      string
		sent, got amqp.Table
		same      bool
	}{
		{"empty and nil", amqp.Table{}, nil, true},
		{"equal", amqp.Table{"a": "x", "n": int64(5)}, amqp.Table{"a": "x", "n": int64(5)}, true},
		{"another width", amqp.Table{"n": int64(5)}, amqp.Table{"n": int32(5)}, true},
		{"float32 back as float64", amqp.Table{"f": float32(1.5)}, amqp.Table{"f": float64(1.5)}, true},
		{"a timestamp to the second", amqp.Table{"t": now}, amqp.Table{"t": now.Truncate(time.Second)}, true},
		{"nested", amqp.Table{"m": amqp.Table{"k": []any{int64(1), "two", []byte{3}}}}, amqp.Table{"m": amqp.Table{"k": []any{int32(1), "two", []byte{3}}}}, true},
		{"another value", amqp.Table{"route": "yes"}, amqp.Table{"route": "no"}, false},
		{"another number", amqp.Table{"n": int64(5)}, amqp.Table{"n": int64(6)}, false},
		{"a missing key", amqp.Table{"a": "x", "b": "y"}, amqp.Table{"a": "x", "c": "y"}, false},
		{"another type", amqp.Table{"a": "1"}, amqp.Table{"a": int64(1)}, false},
		{"another length", amqp.Table{"k": []any{"a"}}, amqp.Table{"k": []any{"a", "b"}}, false},
		{"bytes", amqp.Table{"b": []byte("x")}, amqp.Table{"b": []byte("y")}, false},
	}
	for _, tt := range tests {
		if got := sameTable(tt.sent, tt.got); got != tt.same {
			t.Errorf("%s: sameTable = %v, want %v", tt.name, got, tt.same)
		}
	}
}
