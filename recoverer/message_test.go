package recoverer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqptable"
	"github.com/amqpretry/amqpretry/internal/pubtest"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// What a Republisher publishes, without a broker: the broker suite
// (republish_test.go) keeps confirms, returns and the frame limits it enforces.

var _ recoverer.Publisher = (*publisher.Publisher)(nil)

// recoverOne runs the failing delivery d through Recover(rep) and returns
// the one message published.
func recoverOne(t *testing.T, pub *pubtest.Publisher, rep *recoverer.Republisher, d *amqp.Delivery) pubtest.Published {
	t.Helper()
	ctx := chainrun.WithQueue(context.Background(), "orders")
	if err := middleware.Recover(rep)(failing(errors.New("x")))(ctx, d); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	sent := pub.Sent()
	if len(sent) != 1 {
		t.Fatalf("published %d messages, want 1", len(sent))
	}
	return sent[0]
}

func TestForeignUserIDIsMovedToAHeader(t *testing.T) {
	pub := &pubtest.Publisher{User: "guest"}
	got := recoverOne(t, pub, recoverer.Republish(pub, "orders.dlx", ""), &amqp.Delivery{Body: []byte("x"), UserId: "alice"})
	if got.Msg.UserId != "" || got.Msg.Headers["x-amqpretry-original-user-id"] != "alice" {
		t.Fatalf("user-id %q, header %v: only the publisher's own user may be set", got.Msg.UserId, got.Msg.Headers["x-amqpretry-original-user-id"])
	}
	pub = &pubtest.Publisher{User: "alice"}
	if got := recoverOne(t, pub, recoverer.Republish(pub, "orders.dlx", ""), &amqp.Delivery{UserId: "alice"}); got.Msg.UserId != "alice" {
		t.Errorf("the publisher's own user-id %q was not kept", got.Msg.UserId)
	}
}

func TestExtraHeadersAndPrefix(t *testing.T) {
	pub := &pubtest.Publisher{}
	rep := recoverer.Republish(pub, "orders.dlx", "",
		recoverer.WithHeaderPrefix("acme-"),
		recoverer.WithStackTrace(false),
		recoverer.WithHeaders(func(_ context.Context, d *amqp.Delivery, cause error) amqp.Table {
			return amqp.Table{"acme-team": "payments", "acme-size": len(d.Body)}
		}))
	h := recoverOne(t, pub, rep, &amqp.Delivery{Body: []byte("x")}).Msg.Headers
	if h["acme-team"] != "payments" || h["acme-size"] != int64(1) || h["acme-attempts"] != int64(1) || h["acme-original-queue"] != "orders" {
		t.Errorf("headers = %v", h)
	}
	if _, ok := h["x-exception-stacktrace"]; ok {
		t.Error("stack trace present with WithStackTrace(false)")
	}
	if _, ok := h["x-amqpretry-attempts"]; ok {
		t.Error("default prefix used despite WithHeaderPrefix")
	}
}

// Where the copy goes: the given exchange, with the given key or else the one
// the message was first published with, and that original destination in
// Spring's headers, kept across hops. After a hop (a retry tier we
// republished to, or the broker's reject-to-retry round trip) the delivery
// comes back through the default exchange with the work queue's name as its
// key, which a DLX bound by producer keys would return as unroutable.
func TestRepublishDestination(t *testing.T) {
	death := func(queue, reason, exchange, key string) amqp.Table {
		return amqp.Table{"queue": queue, "reason": reason, "count": int64(1), "exchange": exchange, "routing-keys": []any{key}}
	}
	tierHop := amqp.Table{
		"x-original-exchange": "shop", "x-original-routingKey": "orders.new",
		"x-death": []any{death("orders.retry.10s", "expired", "", "orders.retry.10s")},
	}
	tests := []struct {
		name            string
		key             string
		d               amqp.Delivery
		wantKey         string
		origEx, origKey string
	}{
		{"own key", "", amqp.Delivery{Exchange: "shop", RoutingKey: "orders.new"}, "orders.new", "shop", "orders.new"},
		{"given key", "all", amqp.Delivery{Exchange: "shop", RoutingKey: "orders.new"}, "all", "shop", "orders.new"},
		{"after a tier hop", "", amqp.Delivery{Exchange: "", RoutingKey: "orders", Headers: tierHop}, "orders.new", "shop", "orders.new"},
		{"given key after a tier hop", "all", amqp.Delivery{Exchange: "", RoutingKey: "orders", Headers: tierHop}, "all", "shop", "orders.new"},
		{"after reject-to-retry round trips", "", amqp.Delivery{Exchange: "", RoutingKey: "orders", Headers: amqp.Table{
			"x-death": []any{death("orders.retry", "expired", "", "orders.retry"), death("orders", "rejected", "shop", "orders.new")},
		}}, "orders.new", "shop", "orders.new"},
		{"our headers before x-death", "", amqp.Delivery{Exchange: "", RoutingKey: "orders", Headers: amqp.Table{
			"x-original-exchange": "shop", "x-original-routingKey": "orders.paid",
			"x-death": []any{death("orders", "rejected", "shop", "orders.new")},
		}}, "orders.paid", "shop", "orders.paid"},
		{"came by a named exchange, from a delay queue", "", amqp.Delivery{Exchange: "shop", RoutingKey: "orders.new", Headers: amqp.Table{
			"x-death": []any{death("orders.delay", "expired", "", "orders.delay")},
		}}, "orders.new", "", "orders.delay"},
		{"junk headers read as absent", "", amqp.Delivery{Exchange: "", RoutingKey: "orders", Headers: amqp.Table{
			"x-original-exchange": "shop", "x-original-routingKey": int64(7), "x-death": "junk",
		}}, "orders", "", "orders"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := &pubtest.Publisher{}
			got := recoverOne(t, pub, recoverer.Republish(pub, "orders.dlx", tt.key), &tt.d)
			if got.Exchange != "orders.dlx" || got.Key != tt.wantKey ||
				got.Msg.Headers["x-original-exchange"] != tt.origEx || got.Msg.Headers["x-original-routingKey"] != tt.origKey {
				t.Errorf("to %q with %q, original %v/%v; want orders.dlx with %q, original %s/%s",
					got.Exchange, got.Key, got.Msg.Headers["x-original-exchange"], got.Msg.Headers["x-original-routingKey"], tt.wantKey, tt.origEx, tt.origKey)
			}
		})
	}
}

// A headroom that leaves too little of the broker's frame_max is the
// broker's setting, not a programming error: Recover fails (the listener
// requeues the message) and nothing is published.
func TestHeadroomMustLeaveRoom(t *testing.T) {
	pub := &pubtest.Publisher{Frame: 131072}
	rep := recoverer.Republish(pub, "x", "", recoverer.WithHeadroom(130000))
	err := rep.Recover(context.Background(), &amqp.Delivery{Body: []byte("x")}, errors.New("boom"))
	if err == nil || !strings.Contains(err.Error(), "WithHeadroom(130000) leaves 1072 bytes of the broker's frame_max (131072)") {
		t.Fatalf("Recover = %v", err)
	}
	if chainrun.SettlementFor(&middleware.RecoveryError{Err: err, Cause: errors.New("boom")}) != chainrun.Requeue {
		t.Error("a failed recovery must requeue")
	}
	if n := len(pub.Sent()); n != 0 {
		t.Errorf("published %d messages", n)
	}
}

func TestFailedPublishIsAnError(t *testing.T) {
	pub := &pubtest.Publisher{Err: publisher.ErrUnroutable}
	err := recoverer.Republish(pub, "orders.dlx", "").Recover(context.Background(), &amqp.Delivery{RoutingKey: "k"}, errors.New("boom"))
	if !errors.Is(err, publisher.ErrUnroutable) || !strings.Contains(err.Error(), `exchange "orders.dlx" with routing key "k"`) {
		t.Fatalf("Recover = %v", err)
	}
}

func TestInvalidOptionsPanic(t *testing.T) {
	pub := &pubtest.Publisher{}
	tests := map[string]func(){
		"recoverer: Republish expects a non-nil *publisher.Publisher":  func() { recoverer.Republish(nil, "x", "") },
		"recoverer: WithHeadroom expects 0 to 1048576 bytes, got -1":   func() { recoverer.Republish(pub, "x", "", recoverer.WithHeadroom(-1)) },
		"recoverer: WithPublishTimeout expects a duration > 0, got 0s": func() { recoverer.Republish(pub, "x", "", recoverer.WithPublishTimeout(0)) },
		"recoverer: WithHeaders expects a non-nil function":            func() { recoverer.Republish(pub, "x", "", recoverer.WithHeaders(nil)) },
		"recoverer: Fallback expects at least one Recoverer":           func() { recoverer.Fallback() },
	}
	for want, f := range tests {
		t.Run(want, func(t *testing.T) {
			defer func() {
				if got := recover(); got != want {
					t.Fatalf("panic = %v, want %q", got, want)
				}
			}()
			f()
		})
	}
}

// Every bad argument is named, with its value, in one panic: not just the
// first one found.
func TestRepublishNamesEveryBadArgument(t *testing.T) {
	defer func() {
		got, _ := recover().(string)
		for _, want := range []string{
			"non-nil *publisher.Publisher",
			"WithHeadroom expects 0 to 1048576 bytes, got -1",
			"WithPublishTimeout expects a duration > 0, got -1s",
			"WithHeaders expects a non-nil function",
			"WithHeaderPrefix expects at most 200 bytes (header names are limited to 255), got 201",
			"at most 255 bytes, got 300 and 0",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("panic %q does not say %q", got, want)
			}
		}
	}()
	var nilPub *publisher.Publisher
	recoverer.Republish(nilPub, strings.Repeat("x", 300), "", recoverer.WithHeadroom(-1),
		recoverer.WithPublishTimeout(-time.Second), recoverer.WithHeaders(nil), recoverer.WithHeaderPrefix(strings.Repeat("p", 201)))
}

// A dead letter replayed and failing again carries its old fault text: it
// is replaced, not counted on top of the new one.
func TestRefailedMessageIsRepublished(t *testing.T) {
	pub := &pubtest.Publisher{}
	rep := recoverer.Republish(pub, "orders.dlx", "")
	ctx := chainrun.WithQueue(context.Background(), "orders")
	if err := middleware.Recover(rep)(failing(errors.New(strings.Repeat("a", 500_000))))(ctx, &amqp.Delivery{Body: []byte("x")}); err != nil {
		t.Fatalf("first failure: %v", err)
	}
	first := pub.Sent()[0].Msg
	replayed := &amqp.Delivery{Body: first.Body, Headers: first.Headers} // replayed as is
	if err := middleware.Recover(rep)(failing(errors.New(strings.Repeat("b", 500_000))))(ctx, replayed); err != nil {
		t.Fatalf("second failure: %v", err)
	}
	second := pub.Sent()[1].Msg
	if msg, _ := second.Headers["x-exception-message"].(string); !strings.HasPrefix(msg, "bbb") {
		t.Errorf("the new failure's message should replace the old one, got %.20q", msg)
	}
}

// The headers fit the frame_max the publisher reports, not RabbitMQ's
// default: a broker configured with smaller frames gets smaller headers.
func TestHeadersFitThePublishersFrameMax(t *testing.T) {
	pub := &pubtest.Publisher{Frame: 16384}
	rep := recoverer.Republish(pub, "orders.dlx", "", recoverer.WithHeadroom(2000))
	if err := rep.Recover(context.Background(), &amqp.Delivery{Body: []byte("x")}, errors.New(strings.Repeat("e", 100_000))); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	h := pub.Sent()[0].Msg.Headers
	if size, budget := amqptable.Size(h), 16384-2000; size > budget || size < budget-2048 {
		t.Errorf("headers take %d bytes; with frame_max 16384 and headroom 2000 they should nearly fill %d", size, budget)
	}
}

// Headers that cannot all fit with the fault headers (a delivery of ours can
// carry them only from a broker with a larger frame_max than the DLQ's
// publisher sees): the largest are dropped, the fault headers kept, and the
// dead letter lists what was left out.
func TestHeadersThatCannotFitAreDroppedLargestFirst(t *testing.T) {
	pub := &pubtest.Publisher{Frame: 131072}
	d := &amqp.Delivery{MessageId: "m", Body: []byte("x"), Headers: amqp.Table{
		"first": strings.Repeat("a", 70_000), "second": strings.Repeat("b", 60_000), "small": "kept"}}
	msg, err := recoverer.Republish(pub, "dlx", "").Message(context.Background(), d, errors.New("boom"))
	if err != nil {
		t.Fatalf("Message: %v", err)
	}
	if size, limit := amqptable.PropertiesSize(msg), pub.FrameMax()-amqptable.FrameOverhead; size > limit {
		t.Errorf("properties take %d bytes, more than the %d a frame holds", size, limit)
	}
	if _, ok := msg.Headers["first"]; ok {
		t.Error("the largest header was kept")
	}
	if msg.Headers["second"] == nil || msg.Headers["small"] != "kept" {
		t.Error("a header that fits after the largest is dropped was dropped too")
	}
	if msg.Headers["x-exception-message"] != "boom" || msg.Headers["x-amqpretry-dropped-headers"] != "first" {
		t.Errorf("x-exception-message %v, dropped %v: want boom and \"first\"", msg.Headers["x-exception-message"], msg.Headers["x-amqpretry-dropped-headers"])
	}
}
