package dlx_test

import (
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
)

func TestRetryCount(t *testing.T) {
	death := func(queue, reason string, count any) amqp.Table {
		return amqp.Table{"queue": queue, "reason": reason, "count": count}
	}
	tests := []struct {
		name    string
		headers amqp.Table
		want    int
	}{
		{"none", nil, 0},
		{"header int64", amqp.Table{"x-retry-count": int64(3)}, 3},
		{"header int32", amqp.Table{"x-retry-count": int32(2)}, 2},
		{"header beats x-death", amqp.Table{"x-retry-count": int64(1), "x-death": []any{death("q.retry.1s", "expired", int64(5))}}, 1},
		{"header as string is junk", amqp.Table{"x-retry-count": "3"}, 0},
		{"negative header is junk", amqp.Table{"x-retry-count": int64(-4)}, 0},
		{"huge header is junk", amqp.Table{"x-retry-count": int64(math.MaxInt64)}, 0},
		{"fractional double is junk", amqp.Table{"x-retry-count": 2.5}, 0},
		{"whole double", amqp.Table{"x-retry-count": 2.0}, 2},
		{"x-death expiries summed", amqp.Table{"x-death": []any{
			death("q.retry.1s", "expired", int64(2)), death("q.retry.1m", "expired", int64(1)), death("q", "rejected", int64(3)),
		}}, 3},
		{"x-death not an array", amqp.Table{"x-death": amqp.Table{"count": int64(9)}}, 0},
		{"x-death entries of junk", amqp.Table{"x-death": []any{"x", nil, int64(3), death("q", "expired", "many")}}, 0},
		{"x-death huge counts clamp", amqp.Table{"x-death": []any{death("a", "expired", int64(1<<30)), death("b", "expired", int64(1<<30))}}, 1 << 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := dlx.RetryCount(&amqp.Delivery{Headers: tt.headers}); got != tt.want {
				t.Errorf("RetryCount = %d, want %d", got, tt.want)
			}
		})
	}
	if dlx.RetryCount(nil) != 0 || dlx.Deaths(nil) != nil {
		t.Error("nil delivery")
	}
}

func TestDeaths(t *testing.T) {
	at := time.Unix(1700000000, 0)
	d := &amqp.Delivery{Headers: amqp.Table{"x-death": []any{
		amqp.Table{"queue": "orders", "reason": "rejected", "count": int64(2), "exchange": "shop",
			"routing-keys": []any{"orders.new", int64(7)}, "time": at, "original-expiration": "6000"},
		amqp.Table{"queue": int64(5), "count": int64(-1)},
	}}}
	got := dlx.Deaths(d)
	if len(got) != 2 {
		t.Fatalf("%d entries, want 2", len(got))
	}
	first := got[0]
	if first.Queue != "orders" || first.Reason != "rejected" || first.Count != 2 || first.Exchange != "shop" ||
		len(first.RoutingKeys) != 1 || first.RoutingKeys[0] != "orders.new" || !first.Time.Equal(at) || first.OriginalExpiration != "6000" {
		t.Errorf("first = %+v", first)
	}
	if got[1].Queue != "" || got[1].Count != 0 {
		t.Errorf("junk fields must read as absent: %+v", got[1])
	}
}

// FuzzHeaders: whatever the headers hold, the readers neither panic nor
// return a negative or absurd count.
func FuzzHeaders(f *testing.F) {
	f.Add(int64(3), "q.retry.1s", "expired", int64(2), 1.5, true)
	f.Add(int64(-1), "", "", int64(math.MaxInt64), math.NaN(), false)
	f.Fuzz(func(t *testing.T, header int64, queue, reason string, c int64, fl float64, asDouble bool) {
		var hv any = header
		if asDouble {
			hv = fl
		}
		for _, headers := range []amqp.Table{
			{"x-retry-count": hv},
			{"x-death": []any{amqp.Table{"queue": queue, "reason": reason, "count": c}, queue, c}},
			{"x-death": []any{amqp.Table{"count": fl, "routing-keys": []any{queue, c}, "time": queue}}},
			{"x-death": queue, "x-retry-count": queue},
		} {
			d := &amqp.Delivery{Headers: headers}
			if n := dlx.RetryCount(d); n < 0 || n > 1<<30 {
				t.Fatalf("RetryCount = %d for %v", n, headers)
			}
			for _, death := range dlx.Deaths(d) {
				if death.Count < 0 || death.Count > 1<<30 {
					t.Fatalf("count %d for %v", death.Count, headers)
				}
			}
		}
	})
}
