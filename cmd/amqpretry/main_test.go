package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// TestMain gives the tests an audit log of their own: replay and purge
// write one by default, under $XDG_STATE_HOME.
func TestMain(m *testing.M) {
	state, err := os.MkdirTemp("", "amqpretry-state")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_STATE_HOME", state)
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(state)
		os.Exit(code)
	}))
}

// amqpretry runs the command and returns its exit status and output.
func amqpretry(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append(args, "--url", brokertest.URL()), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// withDeadLetters makes a topology whose DLQ holds n annotated dead letters.
func withDeadLetters(t *testing.T, n int) dlx.Topology {
	t.Helper()
	topo := dlx.Topology{Queue: brokertest.Name(t, "work")}
	t.Cleanup(func() {
		brokertest.DeleteQueue(t, topo.Queue)
		brokertest.DeleteQueue(t, topo.DLQ())
	})
	if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
		t.Fatal(err)
	}
	return withDeadLettersOn(t, topo, n)
}

// withDeadLettersOn puts n annotated dead letters on the DLQ of topo,
// declared.
func withDeadLettersOn(t *testing.T, topo dlx.Topology, n int) dlx.Topology {
	t.Helper()
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range n {
		brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: fmt.Sprintf("order-%d", i), Body: []byte(fmt.Sprintf(`{"order":%d}`, i))})
	}
	rep := recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for i := range n {
		d, _, err := ch.Get(topo.Queue, false)
		if err != nil {
			t.Fatal(err)
		}
		cause := errors.New("customer not found")
		if i%2 == 1 {
			cause = errors.New("tax service\ntimed out")
		}
		if err := rep.Recover(chainrun.WithQueue(context.Background(), topo.Queue), &d, cause); err != nil {
			t.Fatal(err)
		}
		_ = d.Ack(false)
	}
	return topo
}

func TestList(t *testing.T) {
	topo := withDeadLetters(t, 3)
	code, out, errOut := amqpretry(t, "dlq", "list", topo.DLQ())
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"MESSAGE ID", "order-0", "order-2", "customer not found", "tax service timed out", "3 message(s) shown"} {
		if !strings.Contains(out, want) {
			t.Errorf("list output lacks %q:\n%s", want, out)
		}
	}
	if n := brokertest.Depth(t, topo.DLQ()); n != 3 {
		t.Errorf("list must leave the messages in place: %d left", n)
	}
	// FAILED AT to the second, in RFC 3339: no nanoseconds.
	if stamps := rfc3339Seconds.FindAllString(out, -1); len(stamps) != 3 || strings.Contains(out, stamps[0][:19]+".") {
		t.Errorf("list should show each failure time as RFC 3339 to the second:\n%s", out)
	}
	_, out, _ = amqpretry(t, "dlq", "list", topo.DLQ(), "--limit", "1")
	if !strings.Contains(out, "1 message(s) shown") {
		t.Errorf("--limit 1:\n%s", out)
	}
}

// rfc3339Seconds matches a time as the CLI shows it.
var rfc3339Seconds = regexp.MustCompile(`\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\b`)

// dlq list --json: one object per message, with the documented fields,
// the exception whole; the messages stay.
func TestListJSON(t *testing.T) {
	topo := withDeadLetters(t, 3)
	code, out, errOut := amqpretry(t, "dlq", "list", topo.DLQ(), "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var msgs []map[string]any
	if err := json.Unmarshal([]byte(out), &msgs); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, out)
	}
	if len(msgs) != 3 {
		t.Fatalf("%d messages, want 3:\n%s", len(msgs), out)
	}
	want := []string{"index", "key", "message_id", "routing_key", "original_exchange", "original_queue", "exception", "error_type",
		"attempts", "retries", "failed_at", "timestamp", "content_type", "body_bytes"}
	if keys := slices.Sorted(maps.Keys(msgs[0])); !slices.Equal(keys, slices.Sorted(slices.Values(want))) {
		t.Errorf("fields %v, want %v", keys, want)
	}
	m := msgs[1]
	if m["index"] != 1.0 || m["key"] != "id:order-1" || m["message_id"] != "order-1" || m["routing_key"] != topo.Queue || m["original_queue"] != topo.Queue ||
		m["exception"] != "tax service\ntimed out" || m["attempts"] == nil || m["retries"] != 0.0 || m["timestamp"] != nil ||
		m["body_bytes"] != float64(len(`{"order":1}`)) {
		t.Errorf("message 1: %v", m)
	}
	if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m["failed_at"])); err != nil || time.Since(at) > time.Hour {
		t.Errorf("failed_at %v: %v", m["failed_at"], err)
	}
	if n := brokertest.Depth(t, topo.DLQ()); n != 3 {
		t.Errorf("list --json must leave the messages in place: %d left", n)
	}
	// An empty queue is an empty array, not null.
	empty := brokertest.Name(t, "empty")
	brokertest.Queue(t, empty, nil)
	if code, out, _ := amqpretry(t, "dlq", "list", empty, "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("an empty queue: exit %d, %q", code, out)
	}
}

func TestShow(t *testing.T) {
	topo := withDeadLetters(t, 3)
	code, out, errOut := amqpretry(t, "dlq", "show", "--id", "order-1", topo.DLQ())
	if code != 0 || !strings.Contains(out, `{"order":1}`) || !strings.Contains(out, "x-exception-message: tax service") {
		t.Fatalf("exit %d (%s):\n%s", code, errOut, out)
	}
	// Readable times: an unset timestamp is "-", not year 1.
	if !strings.Contains(out, "timestamp:      -\n") || !regexp.MustCompile(`failed at:      \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\n`).MatchString(out) {
		t.Errorf("show's times:\n%s", out)
	}
	if code, _, errOut := amqpretry(t, "dlq", "show", topo.DLQ(), "--key", "id:order-7"); code != 1 || !strings.Contains(errOut, `no message with key "id:order-7"`) {
		t.Errorf("missing key: exit %d, %s", code, errOut)
	}
}

func TestReplay(t *testing.T) {
	topo := withDeadLetters(t, 6)
	code, out, errOut := amqpretry(t, "dlq", "replay", topo.DLQ(), "--match", "customer")
	if code != 0 || !strings.Contains(out, "replayed 3 message(s)") {
		t.Fatalf("exit %d (%s): %s", code, errOut, out)
	}
	if w, d := brokertest.Depth(t, topo.Queue), brokertest.Depth(t, topo.DLQ()); w != 3 || d != 3 {
		t.Fatalf("work %d, dlq %d: want 3 and 3", w, d)
	}
	other := brokertest.Name(t, "other")
	brokertest.Queue(t, other, nil)
	// With --limit, what is left says how many are on the DLQ, not only
	// how many were looked at and skipped.
	if code, out, _ := amqpretry(t, "dlq", "replay", topo.DLQ(), "--to", other, "--limit", "2"); code != 0 ||
		!strings.Contains(out, "replayed 2 message(s) from "+topo.DLQ()+"; 1 message(s) on it now") {
		t.Fatalf("--to --limit: exit %d, %s", code, out)
	}
	if n := brokertest.Depth(t, other); n != 2 {
		t.Errorf("%s holds %d", other, n)
	}
	// A queue that is not there: an error, and no word of a replay.
	code, out, errOut = amqpretry(t, "dlq", "replay", topo.DLQ()+".nosuch")
	if code != 1 || out != "" || !strings.Contains(errOut, "NOT_FOUND") {
		t.Errorf("replay of a missing queue: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// --limit below 0 is refused by every dlq command alike, naming the flag (it
// used to mean "everything" to replay and "100" to list).
func TestNegativeLimitIsRefused(t *testing.T) {
	for _, cmd := range []string{"list", "replay"} {
		code, out, errOut := amqpretry(t, "dlq", cmd, "q", "--limit", "-1")
		if code != 2 || out != "" || !strings.Contains(errOut, "--limit expects 1 or more") || !strings.Contains(errOut, "got -1") {
			t.Errorf("dlq %s --limit -1: exit %d, %s", cmd, code, errOut)
		}
	}
}

func TestPurge(t *testing.T) {
	topo := withDeadLetters(t, 2)
	if code, _, errOut := amqpretry(t, "dlq", "purge", topo.DLQ()); code != 2 || !strings.Contains(errOut, "add --yes") {
		t.Fatalf("purge without --yes: exit %d, %s", code, errOut)
	}
	if brokertest.Depth(t, topo.DLQ()) != 2 {
		t.Fatal("purge without --yes deleted messages")
	}
	if code, out, _ := amqpretry(t, "dlq", "purge", topo.DLQ(), "--yes"); code != 0 || !strings.Contains(out, "purged 2 ready messages") {
		t.Fatalf("purge --yes: exit %d, %s", code, out)
	}
}

func TestFailures(t *testing.T) {
	brokertest.Dial(t)
	code, out, errOut := amqpretry(t, "dlq", "list", brokertest.Name(t, "missing"))
	if code != 1 || out != "" || !strings.Contains(errOut, "NOT_FOUND") {
		t.Errorf("a missing queue: exit %d, %q", code, errOut)
	}
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"dlq", "list", "q", "--url", "amqp://u:hunter2@127.0.0.1:1/"}, &bytes.Buffer{}, &stderr); code != 1 ||
		strings.Contains(stderr.String(), "hunter2") {
		t.Errorf("unreachable broker: exit %d, %q", code, stderr.String())
	}
}

// Looking at a DLQ is not a failure of its messages: list and show hand them
// back with basic.nack, which RabbitMQ 4.3 does not count toward a quorum
// queue's delivery limit, never with a reject or a closed channel.
func TestInspectingHandsBackWithNacks(t *testing.T) {
	topo := withDeadLetters(t, 3)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"dlq", "list", topo.DLQ(), "--url", url}, &stdout, &stderr); code != 0 {
		t.Fatalf("list: exit %d: %s", code, stderr.String())
	}
	if code := run(context.Background(), []string{"dlq", "show", "--id", "order-1", topo.DLQ(), "--url", url}, &stdout, &stderr); code != 0 {
		t.Fatalf("show: exit %d: %s", code, stderr.String())
	}
	// A look hands back with one nack (multiple) on its last delivery; show
	// stops at order-1 and hands back order-2, on its way, with one more.
	brokertest.Eventually(t, 5*time.Second, "the frames through the proxy", func() bool { return proxy.Sent("basic.nack")+proxy.Sent("basic.reject") >= 2 })
	if nacks, rejects, acks := proxy.Sent("basic.nack"), proxy.Sent("basic.reject"), proxy.Sent("basic.ack"); nacks < 2 || nacks > 3 || rejects != 0 || acks != 0 {
		t.Errorf("%d nacks, %d rejects and %d acks; want 2 or 3 nacks (one a look, one for a message on its way when show stopped)", nacks, rejects, acks)
	}
	if n := brokertest.Depth(t, topo.DLQ()); n != 3 {
		t.Errorf("DLQ holds %d, want all 3 back", n)
	}
}

// A hostile dead letter, with terminal escapes in every field a sender
// controls, goes through list and show without one control character
// reaching the terminal: the operator sees them escaped.
func TestHostileDeadLetterIsShownEscaped(t *testing.T) {
	dlq, fanout := brokertest.Name(t, "dlq"), brokertest.Name(t, "fanout")
	brokertest.Queue(t, dlq, nil)
	brokertest.Exchange(t, fanout, "fanout") // routes whatever routing key a sender picks
	brokertest.Bind(t, dlq, fanout, "")
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	hostile := amqp.Publishing{
		MessageId:   "id\x1b[2J\u202e",
		ContentType: "text/\x1b]52;c;ZXZpbA==\x07plain",
		Headers: amqp.Table{
			"x-exception-message":    "boom\x1b[31m\r\u009b2J\nsecond",
			"x-exception-stacktrace": "line1\n\tline2\r\x1b[A",
			"x-amqpretry-attempts":   "3\x1b[K",
			"x-amqpretry-failed-at":  "\u202eevil\x07",
			"h\x1b[8m":               amqp.Table{"k\r": []any{"\x1b]0;title\x07", "\xff\xfe"}},
		},
		Body: []byte("hello \x1b]52;c;cm0gLXJm\x07 world\r\nsecond line \u202e\u009b"),
	}
	binary := amqp.Publishing{MessageId: "bin", ContentType: "application/octet-stream", Body: bytes.Repeat([]byte{0xff, 0x1b, 0x07, 0x9b}, 500)}
	for _, m := range []amqp.Publishing{hostile, binary} {
		if err := pub.Publish(context.Background(), fanout, "key\r\x07\x1b[1A", m); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"dlq", "list", dlq}, []string{`id\x1b[2J\u202e`, `key\r\a\x1b[1A`, `boom\x1b[31m \u009b2J second`, `3\x1b[K`, `\u202eevil\a`, "2 message(s) shown"}},
		{[]string{"dlq", "show", dlq}, []string{
			"message id:     id\\x1b[2J\\u202e\n", `content type:   text/\x1b]52;c;ZXZpbA==\aplain`,
			`  h\x1b[8m: map[k\r:[\x1b]0;title\a \xff\xfe]]`, "  x-exception-stacktrace: line1\n    \\tline2\\r\\x1b[A\n",
			fmt.Sprintf("body (%d bytes):\nhello \\x1b]52;c;cm0gLXJm\\a world\\r\nsecond line \\u202e\\u009b\n", len(hostile.Body)),
		}},
		{[]string{"dlq", "show", dlq, "--id", "bin"}, []string{"body (2000 bytes, binary, content type application/octet-stream):\n00000000  ff 1b 07 9b", "976 more bytes not shown"}},
	}
	for _, tt := range tests {
		code, out, errOut := amqpretry(t, tt.args...)
		if code != 0 {
			t.Fatalf("amqpretry %v: exit %d: %s", tt.args, code, errOut)
		}
		if i, what := terminalUnsafe(out, true); i >= 0 {
			t.Errorf("amqpretry %v printed %s at byte %d:\n%q", tt.args, what, i, out)
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("amqpretry %v: output lacks %q:\n%s", tt.args, w, out)
			}
		}
	}
	if n := brokertest.Depth(t, dlq); n != 2 {
		t.Errorf("%s holds %d, want both messages back", dlq, n)
	}
}

// --url takes the nodes of a cluster, separated by commas: a dead node in
// the list is passed over, for list and for replay's publisher alike.
func TestURLListOfACluster(t *testing.T) {
	topo := withDeadLetters(t, 2)
	dead := "amqp://guest:guest@127.0.0.1:1/"
	nodes := dead + "," + brokertest.URL()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"dlq", "list", topo.DLQ(), "--url", nodes}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "2 message(s) shown") {
		t.Fatalf("list with --url %s: exit %d\n%s%s", nodes, code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := run(context.Background(), []string{"dlq", "replay", topo.DLQ(), "--url", nodes}, &stdout, &stderr); code != 0 {
		t.Fatalf("replay with --url %s: exit %d\n%s%s", nodes, code, stdout.String(), stderr.String())
	}
	if n := brokertest.Depth(t, topo.Queue); n != 2 {
		t.Errorf("replayed %d of 2 to %s", n, topo.Queue)
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"dlq", "list", "q", "--url", brokertest.URL() + ","}, &bytes.Buffer{}, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "--url: an empty address in the list") {
		t.Errorf("a stray comma: exit %d, %q", code, stderr.String())
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"dlq", "list", "q", "--url", brokertest.URL() + ",amqp://u:hunter2@h:notaport/"}, &bytes.Buffer{}, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "--url: invalid AMQP URL") || strings.Contains(stderr.String(), "hunter2") {
		t.Errorf("a bad URL in the list: exit %d, %q", code, stderr.String())
	}
}
