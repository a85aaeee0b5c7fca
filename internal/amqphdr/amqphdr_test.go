package amqphdr_test

import (
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
)

func TestCount(t *testing.T) {
	tests := []struct {
		v    any
		want int
		ok   bool
	}{
		{int64(3), 3, true}, {int32(3), 3, true}, {int16(3), 3, true}, {int8(3), 3, true}, {3, 3, true},
		{uint8(3), 3, true}, {uint16(3), 3, true}, {uint32(3), 3, true}, {float64(3), 3, true},
		{int64(0), 0, true}, {int64(amqphdr.MaxCount), amqphdr.MaxCount, true},
		{int64(-1), 0, false}, {int64(amqphdr.MaxCount + 1), 0, false}, {int64(math.MaxInt64), 0, false},
		{2.5, 0, false}, {math.NaN(), 0, false}, {math.Inf(1), 0, false}, {math.Inf(-1), 0, false},
		{"3", 0, false}, {nil, 0, false}, {uint64(3), 0, false},
	}
	for _, tt := range tests {
		if n, ok := amqphdr.Count(tt.v); n != tt.want || ok != tt.ok {
			t.Errorf("Count(%T %v) = %d, %v; want %d, %v", tt.v, tt.v, n, ok, tt.want, tt.ok)
		}
	}
}

func TestDeliveryCount(t *testing.T) {
	for _, tt := range []struct {
		h    amqp.Table
		want int
	}{
		{nil, 0}, {amqp.Table{}, 0}, {amqp.Table{"x-delivery-count": int64(4)}, 4},
		{amqp.Table{"x-delivery-count": int32(2)}, 2}, {amqp.Table{"x-delivery-count": "4"}, 0},
		{amqp.Table{"x-delivery-count": int64(-4)}, 0},
	} {
		if got := amqphdr.DeliveryCount(tt.h); got != tt.want {
			t.Errorf("DeliveryCount(%v) = %d, want %d", tt.h, got, tt.want)
		}
	}
}

func TestIsBrokerOwned(t *testing.T) {
	for name, want := range map[string]bool{
		"x-death": true, "x-delivery-count": true, "x-first-death-queue": true, "x-last-death-reason": true,
		"x-retry-count": false, "x-original-exchange": false, "tenant": false, "x-deaths": false,
	} {
		if got := amqphdr.IsBrokerOwned(name); got != want {
			t.Errorf("IsBrokerOwned(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestDeathsSkipsJunk(t *testing.T) {
	at := time.Date(2026, 11, 23, 7, 0, 0, 0, time.UTC)
	h := amqp.Table{"x-death": []any{
		amqp.Table{"queue": "orders.retry.10s", "reason": "expired", "count": int64(2), "exchange": "",
			"routing-keys": []any{"orders", 7}, "time": at, "original-expiration": "100"},
		"not a table",
		amqp.Table{"queue": 5, "count": "many"},
	}}
	deaths := amqphdr.Deaths(h)
	if len(deaths) != 2 {
		t.Fatalf("%d deaths, want 2 (the string is skipped)", len(deaths))
	}
	d := deaths[0]
	if d.Queue != "orders.retry.10s" || d.Reason != "expired" || d.Count != 2 || len(d.RoutingKeys) != 1 || d.RoutingKeys[0] != "orders" || !d.Time.Equal(at) || d.OriginalExpiration != "100" {
		t.Errorf("first death %+v", d)
	}
	if deaths[1].Queue != "" || deaths[1].Count != 0 {
		t.Errorf("junk fields should read as zero: %+v", deaths[1])
	}
	if amqphdr.Deaths(amqp.Table{"x-death": "junk"}) == nil || len(amqphdr.Deaths(nil)) != 0 {
		t.Error("Deaths of junk or nothing should be empty, not nil-panicking")
	}
}

func TestOriginalDestination(t *testing.T) {
	death := func(ex string, keys ...any) amqp.Table {
		return amqp.Table{"exchange": ex, "routing-keys": keys}
	}
	tests := []struct {
		name    string
		d       amqp.Delivery
		ex, key string
	}{
		{"no headers", amqp.Delivery{Exchange: "shop", RoutingKey: "orders.new"}, "shop", "orders.new"},
		{"spring headers", amqp.Delivery{Exchange: "", RoutingKey: "orders", Headers: amqp.Table{
			"x-original-exchange": "shop", "x-original-routingKey": "orders.new"}}, "shop", "orders.new"},
		{"the oldest death", amqp.Delivery{Exchange: "", RoutingKey: "orders", Headers: amqp.Table{
			"x-death": []any{death("", "orders"), death("shop", "orders.new")}}}, "shop", "orders.new"},
		{"a death without keys", amqp.Delivery{Exchange: "x", RoutingKey: "k", Headers: amqp.Table{
			"x-death": []any{death("shop")}}}, "x", "k"},
		{"half the spring headers", amqp.Delivery{Exchange: "x", RoutingKey: "k", Headers: amqp.Table{
			"x-original-exchange": "shop"}}, "x", "k"},
	}
	for _, tt := range tests {
		if ex, key := amqphdr.OriginalDestination(&tt.d); ex != tt.ex || key != tt.key {
			t.Errorf("%s: %q, %q; want %q, %q", tt.name, ex, key, tt.ex, tt.key)
		}
	}
}

// Whatever a header holds, reading it never panics and counts stay in range.
func FuzzReaders(f *testing.F) {
	f.Add("orders", int64(3), 1.5, "x-first-death-queue", true)
	f.Add("", int64(-1), math.NaN(), "x-death", false)
	f.Fuzz(func(t *testing.T, s string, n int64, fl float64, name string, asTable bool) {
		var entry any = s
		if asTable {
			entry = amqp.Table{"exchange": s, "routing-keys": []any{s, n, fl}, "count": fl, "time": s, "queue": n}
		}
		h := amqp.Table{"x-death": []any{entry, n, amqp.Table{"count": n}}, "x-delivery-count": fl, name: s,
			"x-original-exchange": n, "x-original-routingKey": s}
		for _, d := range amqphdr.Deaths(h) {
			if d.Count < 0 || d.Count > amqphdr.MaxCount {
				t.Fatalf("count %d", d.Count)
			}
		}
		if c := amqphdr.DeliveryCount(h); c < 0 || c > amqphdr.MaxCount {
			t.Fatalf("delivery count %d", c)
		}
		_, _ = amqphdr.OriginalDestination(&amqp.Delivery{Headers: h})
		_ = amqphdr.IsBrokerOwned(name)
	})
}
