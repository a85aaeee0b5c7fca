package recoverer_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqptable"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newPublisher(t *testing.T, url string) *publisher.Publisher {
	t.Helper()
	brokertest.Dial(t)
	p, err := publisher.New(url, publisher.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// topology declares a work queue and a DLX (direct) bound to a DLQ with the
// work queue's name as key, as most users set it up.
func topology(t *testing.T) (work, dlx, dlq string) {
	work, dlx, dlq = brokertest.Name(t, "work"), brokertest.Name(t, "dlx"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, work, nil)
	brokertest.Queue(t, dlq, nil)
	brokertest.Exchange(t, dlx, "direct")
	brokertest.Bind(t, dlq, dlx, work)
	return work, dlx, dlq
}

// handleOne takes one message from queue, runs it through chain(h) and
// settles it as the listener would.
func handleOne(t *testing.T, queue string, chain middleware.Middleware, h middleware.Handler) (chainrun.Settlement, error) {
	t.Helper()
	ch := brokertest.Channel(t, brokertest.Dial(t))
	d, ok, err := ch.Get(queue, false)
	if err != nil || !ok {
		t.Fatalf("get from %s: ok=%v err=%v", queue, ok, err)
	}
	ctx := chainrun.WithQueue(context.Background(), queue)
	result := chain(h)(ctx, &d)
	s, err := chainrun.Settle(&d, result)
	if err != nil {
		t.Fatal(err)
	}
	return s, result
}

func failing(err error) middleware.Handler {
	return func(context.Context, *amqp.Delivery) error { return err }
}

func retryFast(n int) middleware.Middleware {
	return middleware.Retry(n, middleware.WithInitialInterval(time.Millisecond))
}

func TestRepublishCopiesAndAnnotates(t *testing.T) {
	work, dlx, dlq := topology(t)
	pub := newPublisher(t, brokertest.URL())
	stamp := time.Unix(1700000000, 0)
	brokertest.Publish(t, work, amqp.Publishing{
		ContentType: "application/json", ContentEncoding: "gzip", Priority: 3,
		CorrelationId: "corr-1", ReplyTo: "replies", MessageId: "msg-1", Timestamp: stamp,
		Type: "order.created", AppId: "shop", Expiration: "600000", DeliveryMode: amqp.Transient,
		Headers: amqp.Table{
			"tenant": "acme", "x-death": []any{amqp.Table{"count": int64(3)}}, "x-delivery-count": int64(2),
			"x-first-death-queue": "old", "x-last-death-reason": "rejected",
		},
		Body: []byte(`{"order":7}`),
	})

	rep := recoverer.Republish(pub, dlx, "")
	s, err := handleOne(t, work, middleware.Chain(retryFast(3), middleware.Recover(rep)), failing(errors.New("customer 7 not found")))
	if s != chainrun.Ack || err != nil {
		t.Fatalf("settled %v (%v), want ack after a confirmed republish", s, err)
	}
	if n := brokertest.Depth(t, work); n != 0 {
		t.Errorf("work queue holds %d, want the original acked", n)
	}

	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	if !ok {
		t.Fatal("nothing on the DLQ")
	}
	if string(d.Body) != `{"order":7}` || d.ContentType != "application/json" || d.ContentEncoding != "gzip" ||
		d.Priority != 3 || d.CorrelationId != "corr-1" || d.ReplyTo != "replies" || d.MessageId != "msg-1" ||
		!d.Timestamp.Equal(stamp) || d.Type != "order.created" || d.AppId != "shop" {
		t.Errorf("properties not copied: %+v", d)
	}
	if d.DeliveryMode != amqp.Persistent {
		t.Errorf("delivery mode %d, want persistent", d.DeliveryMode)
	}
	if d.Expiration != "" || d.Headers["x-amqpretry-original-expiration"] != "600000" {
		t.Errorf("expiration %q / header %v: a dead letter must not expire, and the TTL is kept in a header", d.Expiration, d.Headers["x-amqpretry-original-expiration"])
	}
	want := map[string]any{
		"tenant":                     "acme",
		"x-exception-message":        "customer 7 not found",
		"x-original-exchange":        "",
		"x-original-routingKey":      work,
		"x-amqpretry-original-queue": work,
		"x-amqpretry-error-type":     "*errors.errorString",
		"x-amqpretry-attempts":       int64(3),
	}
	for k, v := range want {
		if d.Headers[k] != v {
			t.Errorf("header %s = %#v, want %#v", k, d.Headers[k], v)
		}
	}
	for _, k := range []string{"x-death", "x-delivery-count", "x-first-death-queue", "x-last-death-reason"} {
		if _, ok := d.Headers[k]; ok {
			t.Errorf("broker-owned header %s was copied", k)
		}
	}
	if st, _ := d.Headers["x-exception-stacktrace"].(string); !strings.Contains(st, "*errors.errorString: customer 7 not found") {
		t.Errorf("stack trace = %q", st)
	}
	if at, _ := d.Headers["x-amqpretry-failed-at"].(string); at == "" {
		t.Error("no failed-at header")
	} else if ts, err := time.Parse(time.RFC3339Nano, at); err != nil || time.Since(ts) > time.Minute {
		t.Errorf("failed-at %q: %v", at, err)
	}
	if h, _ := d.Headers["x-amqpretry-host"].(string); h == "" {
		t.Error("no host header")
	}
}

// No path acks an original whose copy was not confirmed.
func TestFailedRepublishKeepsTheOriginal(t *testing.T) {
	proxy, viaProxy := brokertest.Proxy(t)

	tests := []struct {
		name     string
		exchange func(dlx string) string
		rkey     string
		outage   bool
		wantErr  error
	}{
		{"unroutable", func(dlx string) string { return dlx }, "no-binding", false, publisher.ErrUnroutable},
		{"missing exchange", func(string) string { return "amqpretry-test.no-such-exchange" }, "", false, nil},
		{"publisher outage", func(dlx string) string { return dlx }, "", true, publisher.ErrNotConfirmed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			work, dlx, dlq := topology(t)
			pub := newPublisher(t, viaProxy)
			brokertest.Publish(t, work, amqp.Publishing{Body: []byte("precious")})
			if tt.outage {
				proxy.Refuse(true)
				proxy.CutAll()
				defer proxy.Refuse(false)
			}
			rep := recoverer.Republish(pub, tt.exchange(dlx), tt.rkey, recoverer.WithPublishTimeout(time.Second))
			s, err := handleOne(t, work, middleware.Chain(retryFast(2), middleware.Recover(rep)), failing(middleware.Permanent(errors.New("bad"))))
			if s != chainrun.Requeue || !errors.Is(err, middleware.ErrRecoveryFailed) {
				t.Fatalf("settled %v (%v), want requeue after a failed recovery", s, err)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("err = %v, want it to match %v", err, tt.wantErr)
			}
			if tt.name == "missing exchange" && !strings.Contains(err.Error(), "amqpretry-test.no-such-exchange") {
				t.Errorf("err = %v, want it to name the exchange", err)
			}
			if n := brokertest.Depth(t, work); n != 1 {
				t.Errorf("work queue holds %d, want the original back", n)
			}
			if n := brokertest.Depth(t, dlq); n != 0 {
				t.Errorf("DLQ holds %d, want nothing", n)
			}
		})
	}
}

// A 3 MB error message made of multi-byte runes: the copy is published with
// its headers inside frame_max minus the headroom, cut on rune boundaries.
func TestHugeErrorMessageFitsTheFrame(t *testing.T) {
	work, dlx, dlq := topology(t)
	pub := newPublisher(t, brokertest.URL())
	brokertest.Publish(t, work, amqp.Publishing{Body: []byte("x"), Headers: amqp.Table{"keep": "me"}})
	huge := strings.Repeat("错误", 500_000) // 3,000,000 bytes
	s, err := handleOne(t, work, middleware.Chain(retryFast(2), middleware.Recover(recoverer.Republish(pub, dlx, ""))), failing(errors.New(huge)))
	if s != chainrun.Ack {
		t.Fatalf("settled %v (%v), want ack", s, err)
	}
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	if !ok {
		t.Fatal("nothing on the DLQ")
	}
	if size, budget := amqptable.Size(d.Headers), pub.FrameMax()-recoverer.DefaultHeadroom; size > budget {
		t.Errorf("headers take %d bytes, budget %d", size, budget)
	}
	msg, _ := d.Headers["x-exception-message"].(string)
	if !utf8.ValidString(msg) || !strings.HasPrefix(msg, "错误错误") || !strings.Contains(msg, "…[cut ") {
		t.Errorf("message not cut cleanly: %q…", msg[:min(len(msg), 60)])
	}
	if st, _ := d.Headers["x-exception-stacktrace"].(string); !utf8.ValidString(st) {
		t.Error("stack trace is not valid UTF-8")
	}
	if d.Headers["keep"] != "me" {
		t.Error("application header lost")
	}
}

func TestRejectUsesTheQueuesOwnDLX(t *testing.T) {
	dlx, dlq := brokertest.Name(t, "dlx"), brokertest.Name(t, "dlq")
	brokertest.Exchange(t, dlx, "fanout")
	brokertest.Queue(t, dlq, nil)
	brokertest.Bind(t, dlq, dlx, "")
	work := brokertest.Name(t, "work")
	brokertest.Queue(t, work, amqp.Table{"x-dead-letter-exchange": dlx})
	pub := newPublisher(t, brokertest.URL())
	brokertest.Publish(t, work, amqp.Publishing{Body: []byte("x")})

	// The republish is unroutable, so Fallback moves on to Reject.
	r := recoverer.Fallback(recoverer.Republish(pub, dlx+".missing", ""), recoverer.Reject())
	s, err := handleOne(t, work, middleware.Chain(retryFast(2), middleware.Recover(r)), failing(errors.New("x")))
	if s != chainrun.Reject {
		t.Fatalf("settled %v (%v), want reject", s, err)
	}
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	if !ok || d.Headers["x-death"] == nil {
		t.Fatalf("ok=%v headers %v: want the broker's own dead-lettering, with x-death", ok, d.Headers)
	}
}

func TestRequeueKeepsEvenPermanentFailures(t *testing.T) {
	work := brokertest.Name(t, "work")
	brokertest.Queue(t, work, nil)
	brokertest.Publish(t, work, amqp.Publishing{Body: []byte("x")})
	s, err := handleOne(t, work, middleware.Recover(recoverer.Requeue()), failing(middleware.Permanent(errors.New("x"))))
	if s != chainrun.Requeue || !errors.Is(err, recoverer.ErrRequeueRequested) || brokertest.Depth(t, work) != 1 {
		t.Fatalf("settled %v (%v), depth %d: want it back on its queue", s, err, brokertest.Depth(t, work))
	}
}

// Headroom 0 uses the frame to the last byte the other properties leave.
func TestZeroHeadroomFitsTheFrameExactly(t *testing.T) {
	work, dlx, dlq := topology(t)
	pub := newPublisher(t, brokertest.URL())
	brokertest.Publish(t, work, amqp.Publishing{Body: []byte("x"), MessageId: "m", ContentType: "text/plain"})
	rep := recoverer.Republish(pub, dlx, "", recoverer.WithHeadroom(0))
	s, err := handleOne(t, work, middleware.Recover(rep), failing(errors.New(strings.Repeat("y", 200_000))))
	if s != chainrun.Ack {
		t.Fatalf("settled %v (%v): with headroom 0 the copy must still fit", s, err)
	}
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	if !ok {
		t.Fatal("nothing on the DLQ")
	}
	props := amqp.Publishing{Headers: d.Headers, MessageId: d.MessageId, ContentType: d.ContentType, DeliveryMode: d.DeliveryMode}
	// The frame is filled but for 1 KiB kept for the trace headers the
	// publisher may add.
	if used, limit := amqptable.PropertiesSize(props), pub.FrameMax()-amqptable.FrameOverhead; used > limit-1024 || used < limit-1024-100 {
		t.Errorf("properties take %d bytes; the frame allows %d, less 1024 for trace headers, and the headers should fill it", used, limit)
	}
}

// A DLX bound only by the producer's routing key receives the dead letter of
// a message that came back to its work queue through the default exchange
// (routing key = the queue's name): after a hop through a retry tier we
// republished it to, and after reject-to-retry round trips the broker made
// alone, where only x-death remembers the producer's key.
func TestEmptyKeyReachesADLXBoundByTheProducersKey(t *testing.T) {
	const producerKey = "orders.created"
	const ttl = 100 // ms a message waits in the retry queue
	tests := []struct {
		name string
		// hop sends d from the work queue to the retry queue, which sends it
		// back when its TTL expires.
		hop func(t *testing.T, pub *publisher.Publisher, work, retry string, d *amqp.Delivery)
		// rounds is how often the message makes the hop before it dies.
		rounds int
	}{
		{"tier we republished to", func(t *testing.T, pub *publisher.Publisher, work, retry string, d *amqp.Delivery) {
			ctx := chainrun.WithQueue(context.Background(), work)
			if err := recoverer.Republish(pub, "", retry).Recover(ctx, d, errors.New("try later")); err != nil {
				t.Fatal(err)
			}
			_ = d.Ack(false)
		}, 1},
		{"reject to retry", func(t *testing.T, _ *publisher.Publisher, _, _ string, d *amqp.Delivery) {
			_ = d.Reject(false)
		}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shop, work, retry := brokertest.Name(t, "shop"), brokertest.Name(t, "work"), brokertest.Name(t, "retry")
			dlx, dlq := brokertest.Name(t, "dlx"), brokertest.Name(t, "dlq")
			brokertest.Exchange(t, shop, "direct")
			brokertest.Queue(t, work, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry})
			brokertest.Bind(t, work, shop, producerKey)
			brokertest.Queue(t, retry, amqp.Table{"x-message-ttl": int64(ttl), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": work})
			brokertest.Exchange(t, dlx, "direct")
			brokertest.Queue(t, dlq, nil)
			brokertest.Bind(t, dlq, dlx, producerKey)
			pub := newPublisher(t, brokertest.URL())
			if err := pub.Publish(context.Background(), shop, producerKey, amqp.Publishing{MessageId: "m1"}); err != nil {
				t.Fatal(err)
			}

			ch := brokertest.Channel(t, brokertest.Dial(t))
			next := func() amqp.Delivery {
				t.Helper()
				var d amqp.Delivery
				brokertest.Eventually(t, 10*time.Second, "the message on "+work, func() bool {
					var ok bool
					var err error
					d, ok, err = ch.Get(work, false)
					if err != nil {
						t.Fatal(err)
					}
					return ok
				})
				return d
			}
			for range tt.rounds {
				d := next()
				tt.hop(t, pub, work, retry, &d)
			}
			d := next()
			if d.RoutingKey != work {
				t.Fatalf("back on %s with routing key %q: the test needs the default exchange's key, the queue's name", work, d.RoutingKey)
			}
			ctx := chainrun.WithQueue(context.Background(), work)
			if err := recoverer.Republish(pub, dlx, "").Recover(ctx, &d, errors.New("gave up")); err != nil {
				t.Fatalf("Recover: %v", err)
			}
			_ = d.Ack(false)
			if got, ok := brokertest.Get(t, ch, dlq); !ok || got.MessageId != "m1" || got.Headers["x-original-routingKey"] != producerKey {
				t.Errorf("DLQ: ok=%v, message %q, x-original-routingKey %v", ok, got.MessageId, got.Headers["x-original-routingKey"])
			}
		})
	}
}

// A message whose own headers fit the broker's frame but not the frame less
// the 20,000-byte headroom (a 115 kB header here) still reaches the DLQ: the
// headroom gives way, the fault text is cut to what is left, and the
// message's own headers are kept. Before, the recovery failed every time and
// the message was requeued for ever.
func TestHeadersThatFillTheFrameStillReachTheDLQ(t *testing.T) {
	work, dlx, dlq := topology(t)
	pub := newPublisher(t, brokertest.URL())
	big := strings.Repeat("h", 115_000)
	brokertest.Publish(t, work, amqp.Publishing{MessageId: "big", Body: []byte("x"), Headers: amqp.Table{"big": big, "keep": "me"}})
	s, err := handleOne(t, work, middleware.Chain(retryFast(2), middleware.Recover(recoverer.Republish(pub, dlx, ""))), failing(errors.New("boom")))
	if s != chainrun.Ack {
		t.Fatalf("settled %v (%v), want ack: the dead letter could not be written", s, err)
	}
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	if !ok {
		t.Fatal("nothing on the DLQ")
	}
	if d.Headers["big"] != big || d.Headers["keep"] != "me" {
		t.Error("the message's own headers were not kept, though they fit")
	}
	if msg, _ := d.Headers["x-exception-message"].(string); msg != "boom" {
		t.Errorf("x-exception-message = %q, want boom", msg)
	}
	if _, ok := d.Headers["x-amqpretry-dropped-headers"]; ok {
		t.Error("headers were dropped, though they fit")
	}
}

// A publisher that publishes events without mandatory still cannot lose a
// dead letter: Republish asks for mandatory on every publish, so a DLX that
// routes the copy nowhere is an error, and the original stays.
func TestRepublishIsMandatoryWhateverThePublisher(t *testing.T) {
	ex := brokertest.Name(t, "dlx-to-nowhere")
	brokertest.Exchange(t, ex, "direct")
	pub, err := publisher.New(brokertest.URL(), publisher.WithMandatory(false))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	err = recoverer.Republish(pub, ex, "orders").Recover(context.Background(), &amqp.Delivery{Body: []byte("x")}, errors.New("boom"))
	if !errors.Is(err, publisher.ErrUnroutable) {
		t.Errorf("Recover = %v, want ErrUnroutable: a dead letter no queue takes is not safely anywhere", err)
	}
}
