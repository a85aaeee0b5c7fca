package recoverer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/recoverer"
)

// nested is depth tables, one inside the other, the innermost holding a
// string: as deep as amqp091-go reads (its header table is level 0, each
// table or array inside one level more, at most 32).
func nested(depth int) amqp.Table {
	t := amqp.Table{"leaf": "bottom"}
	for range depth - 1 {
		t = amqp.Table{"d": t}
	}
	return t
}

// Headers nested exactly 32 deep, as another client may send them: amqp091-go
// delivers them, so the dead letter must carry them (issue 41, item 2). The
// recoverer used to count the innermost table's values as a 33rd level and
// refuse the copy, and the listener requeued the message for ever.
func TestRepublishKeepsHeadersNested32Deep(t *testing.T) {
	work, dlx, dlq := topology(t)
	pub := newPublisher(t, brokertest.URL())
	brokertest.Publish(t, work, amqp.Publishing{Body: []byte("deep"), Headers: amqp.Table{"deep": nested(32)}})

	s, err := handleOne(t, work, middleware.Chain(retryFast(1), middleware.Recover(recoverer.Republish(pub, dlx, ""))),
		failing(errors.New("boom")))
	if s != chainrun.Ack {
		t.Fatalf("settled %v (%v), want ack after the dead letter is confirmed", s, err)
	}
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	if !ok {
		t.Fatal("nothing on the DLQ")
	}
	v := d.Headers["deep"]
	for level := 1; level < 32; level++ {
		tab, ok := v.(amqp.Table)
		if !ok {
			t.Fatalf("level %d of the deep header is %T, want a table", level, v)
		}
		v = tab["d"]
	}
	if leaf, _ := v.(amqp.Table); leaf["leaf"] != "bottom" {
		t.Errorf("the 32nd table is %#v, want the leaf", v)
	}
	if dropped, ok := d.Headers["x-amqpretry-dropped-headers"]; ok {
		t.Errorf("dropped %v; nothing needed dropping", dropped)
	}
}

// A header the recoverer cannot publish (one a WithHeaders function adds: a
// table nested too deep, a uint64 past int64) is left out of the dead letter
// and named in the dropped-headers header, as one too large for the frame is:
// refusing the copy would requeue the message for ever.
func TestRepublishDropsHeadersItCannotWrite(t *testing.T) {
	work, dlx, dlq := topology(t)
	pub := newPublisher(t, brokertest.URL())
	brokertest.Publish(t, work, amqp.Publishing{Body: []byte("x"), Headers: amqp.Table{"keep": "me"}})
	cyclic := amqp.Table{}
	cyclic["self"] = cyclic
	extra := recoverer.WithHeaders(func(_ context.Context, _ *amqp.Delivery, _ error) amqp.Table {
		return amqp.Table{"too-deep": nested(33), "cycle": cyclic, "huge": uint64(1 << 63), "fine": int64(7),
			"odd": struct{}{}}
	})
	s, err := handleOne(t, work, middleware.Chain(retryFast(1), middleware.Recover(recoverer.Republish(pub, dlx, "", extra))),
		failing(errors.New("boom")))
	if s != chainrun.Ack {
		t.Fatalf("settled %v (%v), want ack", s, err)
	}
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	if !ok {
		t.Fatal("nothing on the DLQ")
	}
	if d.Headers["keep"] != "me" || d.Headers["fine"] != int64(7) {
		t.Errorf("headers %v: the writable ones must stay", d.Headers)
	}
	list, _ := d.Headers["x-amqpretry-dropped-headers"].(string)
	for _, k := range []string{"too-deep", "cycle", "huge", "odd"} {
		if _, ok := d.Headers[k]; ok {
			t.Errorf("header %s was published", k)
		}
		if !strings.Contains(list, k) {
			t.Errorf("dropped-headers %q does not name %s", list, k)
		}
	}
}

// A panic with a 3.5 MB value: the dead letter keeps the goroutine's frames,
// with the value shortened inside them, and both fault headers end in a cut
// marker (issue 41, item 4). The stack trace used to be "" and the message
// all of the room, with no marker in the stack.
func TestHugePanicKeepsItsFramesAndMarkers(t *testing.T) {
	work, dlx, dlq := topology(t)
	pub := newPublisher(t, brokertest.URL())
	brokertest.Publish(t, work, amqp.Publishing{Body: []byte("x")})
	huge := strings.Repeat("v", 3_500_000)
	panicking := func(context.Context, *amqp.Delivery) error { panic(huge) }
	s, err := handleOne(t, work, middleware.Chain(retryFast(1), middleware.Recover(recoverer.Republish(pub, dlx, "")), middleware.CatchPanics()), panicking)
	if s != chainrun.Ack {
		t.Fatalf("settled %v (%v), want ack", s, err)
	}
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	if !ok {
		t.Fatal("nothing on the DLQ")
	}
	stack, _ := d.Headers[recoverer.HeaderExceptionStacktrace].(string)
	message, _ := d.Headers[recoverer.HeaderExceptionMessage].(string)
	if !strings.Contains(stack, "goroutine ") || !strings.Contains(stack, "TestHugePanicKeepsItsFramesAndMarkers") {
		t.Errorf("the stack trace (%d bytes) lost the frames: %.300q", len(stack), stack)
	}
	if !strings.Contains(stack, "…[cut ") {
		t.Errorf("the stack trace (%d bytes) has no cut marker", len(stack))
	}
	if !strings.HasSuffix(message, " bytes]") || !strings.Contains(message, "…[cut ") {
		t.Errorf("the message (%d bytes) does not end in a cut marker: …%q", len(message), message[max(0, len(message)-60):])
	}
}

// A message with nearly 8,192 headers is readable; with the fault headers
// added its copy would not be (amqp091-go refuses a table of more than
// 8,192 entries), and whoever consumes the DLQ would lose its connection on
// it. The copy drops enough of the message's own headers to stay readable,
// and names them.
func TestRepublishKeepsTheCopyReadableAt8192Headers(t *testing.T) {
	work, dlx, dlq := topology(t)
	pub := newPublisher(t, brokertest.URL())
	headers := amqp.Table{}
	for i := range 8190 {
		headers[fmt.Sprint("h", i)] = int32(i)
	}
	brokertest.Publish(t, work, amqp.Publishing{Body: []byte("wide"), Headers: headers})
	s, err := handleOne(t, work, middleware.Chain(retryFast(1), middleware.Recover(recoverer.Republish(pub, dlx, ""))),
		failing(errors.New("boom")))
	if s != chainrun.Ack {
		t.Fatalf("settled %v (%v), want ack", s, err)
	}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	d, ok, err := ch.Get(dlq, true)
	if err != nil || !ok {
		t.Fatalf("the dead letter cannot be read: ok=%v err=%v", ok, err)
	}
	if len(d.Headers) > 8192 || d.Headers[recoverer.HeaderExceptionMessage] != "boom" {
		t.Errorf("%d headers, exception %v", len(d.Headers), d.Headers[recoverer.HeaderExceptionMessage])
	}
	if list, _ := d.Headers["x-amqpretry-dropped-headers"].(string); list == "" {
		t.Error("no dropped-headers list")
	}
}
