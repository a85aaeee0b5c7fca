package framecheck_test

import (
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/framecheck"
)

func nestedTables(depth int) amqp.Table {
	t := amqp.Table{"leaf": "x"}
	for range depth - 1 {
		t = amqp.Table{"d": t}
	}
	return t
}

func list(n int) []any {
	l := make([]any, n)
	for i := range l {
		l[i] = int32(i)
	}
	return l
}

func wide(n int) amqp.Table {
	t := amqp.Table{}
	for i := range n {
		t[fmt.Sprint("k", i)] = int32(i)
	}
	return t
}

// dialGuarded connects to the test broker with its socket guarded.
func dialGuarded(t *testing.T) *amqp.Connection {
	t.Helper()
	brokertest.Dial(t) // skips, or fails, without a broker
	conn, err := amqp.DialConfig(brokertest.URL(), amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, 10*time.Second)
		if err != nil {
			return nil, err
		}
		return framecheck.Guard(c), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Headers written with amqp091-go's own table writer, through a real broker,
// read back by amqp091-go's own reader: what it can read arrives untouched,
// what it cannot (one level or one entry past its limits) arrives with the
// table replaced, and the connection lives on to read what follows.
func TestGuardReplacesOnlyWhatAmqp091CannotRead(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	cases := []struct {
		name     string
		headers  amqp.Table
		readable bool
	}{
		{"plain", amqp.Table{"a": "b", "n": int64(1)}, true},
		{"tables 32 deep", amqp.Table{"h": nestedTables(32)}, true},
		{"tables 33 deep", amqp.Table{"h": nestedTables(33)}, false},
		{"array of 8192", amqp.Table{"h": list(8192)}, true},
		{"array of 8193", amqp.Table{"h": list(8193)}, false},
		{"table of 8192", amqp.Table{"h": wide(8192)}, true},
		{"table of 8193", amqp.Table{"h": wide(8193)}, false},
		{"headers of 8193", wide(8193), false},
		{"after them", amqp.Table{"still": "here"}, true},
	}
	for i, c := range cases {
		brokertest.Publish(t, q, amqp.Publishing{MessageId: c.name, ContentType: "text/plain", Body: []byte(fmt.Sprint(i)), Headers: c.headers})
	}
	ch := brokertest.Channel(t, dialGuarded(t))
	for i, c := range cases {
		d, ok, err := ch.Get(q, true)
		if err != nil || !ok {
			t.Fatalf("%s: get: ok=%v err=%v", c.name, ok, err)
		}
		if d.MessageId != c.name || string(d.Body) != fmt.Sprint(i) || d.ContentType != "text/plain" {
			t.Errorf("%s: got message %q body %q type %q", c.name, d.MessageId, d.Body, d.ContentType)
		}
		reason, replaced := d.Headers[amqphdr.UnreadableHeaders].(string)
		switch {
		case c.readable && !reflect.DeepEqual(d.Headers, c.headers):
			t.Errorf("%s: headers changed (replaced: %q)", c.name, reason)
		case !c.readable && (!replaced || len(d.Headers) != 1):
			t.Errorf("%s: headers %d entries, not replaced", c.name, len(d.Headers))
		case !c.readable && !strings.Contains(reason, "amqp091-go cannot read"):
			t.Errorf("%s: reason %q", c.name, reason)
		}
	}
}

// Without the guard, amqp091-go closes the connection on such a message:
// what the guard is for.
func TestUnguardedConnectionDiesOnUnreadableHeaders(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{Headers: amqp.Table{"h": nestedTables(33)}})
	conn := brokertest.Dial(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ch.Get(q, false); err == nil {
		t.Fatal("amqp091-go read headers nested 33 deep: the guard may no longer be needed (see the package documentation)")
	}
	brokertest.Eventually(t, 10*time.Second, "the connection closed", conn.IsClosed)
	// The client closed its end; the broker requeues the message once it
	// sees the socket close, which under load comes a little later.
	brokertest.Eventually(t, 10*time.Second, "the message back in the queue", func() bool { return brokertest.Depth(t, q) == 1 })
}

func TestRewriteLeavesOtherFramesAlone(t *testing.T) {
	for _, f := range [][]byte{
		{2, 0, 1, 0, 0, 0, 2, 0, 60, 0xCE},                                      // too short to be a content header
		{2, 0, 1, 0, 0, 0, 14, 0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xCE}, // no properties
	} {
		if out, changed := framecheck.Rewrite(f); changed || !reflect.DeepEqual(out, f) {
			t.Errorf("Rewrite(%v) = %v, %v", f, out, changed)
		}
	}
	if p := framecheck.TableProblem([]byte{3, 'k', 'e', 'y', 'Z'}); !strings.Contains(p, "does not know") {
		t.Errorf("an unknown type: %q", p)
	}
	if p := framecheck.TableProblem([]byte{3, 'k', 'e', 'y', 'S', 0, 0, 0, 9, 'x'}); !strings.Contains(p, "runs past") {
		t.Errorf("a truncated string: %q", p)
	}
}

// Bodies of many frames, and many messages at once, pass the guard byte for
// byte.
func TestGuardPassesLargeBodies(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	big := []byte(strings.Repeat("0123456789", 300_000)) // 3 MB: 23 frames at the default frame_max
	var msgs []amqp.Publishing
	for i := range 50 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprint(i), Body: []byte(fmt.Sprint("small ", i))})
	}
	msgs = append(msgs, amqp.Publishing{MessageId: "big", Body: big, Headers: amqp.Table{"h": nestedTables(33)}})
	brokertest.Publish(t, q, msgs...)
	ch := brokertest.Channel(t, dialGuarded(t))
	if err := ch.Qos(100, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range msgs {
		select {
		case d := <-deliveries:
			if d.MessageId != want.MessageId || string(d.Body) != string(want.Body) {
				t.Fatalf("delivery %d: id %q, %d bytes; want %q, %d bytes", i, d.MessageId, len(d.Body), want.MessageId, len(want.Body))
			}
			_ = d.Ack(false)
		case <-time.After(30 * time.Second):
			t.Fatalf("delivery %d did not come", i)
		}
	}
}

// FuzzRewrite: whatever bytes a content header frame holds, Rewrite does not
// panic, and what it rewrites is a frame whose size field matches.
func FuzzRewrite(f *testing.F) {
	f.Add([]byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x20, 0, 0, 0, 0, 5, 1, 'k', 'A', 0, 0})
	f.Add([]byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xE0, 0, 1, 'a', 0, 0, 0, 0, 3, 1, 'k', 'Z'})
	f.Fuzz(func(t *testing.T, payload []byte) {
		frame := append([]byte{2, 0, 1, 0, 0, 0, 0}, payload...)
		frame = append(frame, 0xCE)
		out, changed := framecheck.Rewrite(frame)
		if !changed {
			return
		}
		if size := int(out[3])<<24 | int(out[4])<<16 | int(out[5])<<8 | int(out[6]); size != len(out)-8 || out[len(out)-1] != 0xCE {
			t.Fatalf("rewritten frame of %d bytes says %d", len(out), size)
		}
	})
}
