package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/recoverer"
)

// One dead letter amqp091-go cannot read, between two it can: list shows all
// three, the odd one marked, and replay moves the other two and leaves it
// (issue 41, item 3). Both used to fail outright at it.
func TestDLQToolsCarryOnPastAnUnreadableDeadLetter(t *testing.T) {
	topo := withDeadLetters(t, 1)
	origin := func(extra amqp.Table) amqp.Table {
		h := amqp.Table{recoverer.DefaultHeaderPrefix + recoverer.SuffixOriginalQueue: topo.Queue, recoverer.HeaderExceptionMessage: "later"}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	brokertest.Publish(t, topo.DLQ(),
		amqp.Publishing{MessageId: "unreadable", Headers: origin(amqp.Table{"deep": brokertest.HeadersTooDeep()})},
		amqp.Publishing{MessageId: "after", Headers: origin(nil)})

	code, out, errOut := amqpretry(t, "dlq", "list", topo.DLQ())
	if code != 0 || !strings.Contains(out, "3 message(s) shown") || !strings.Contains(out, "after") ||
		!strings.Contains(out, "headers unreadable") {
		t.Fatalf("list: exit %d (%s):\n%s", code, errOut, out)
	}
	code, out, errOut = amqpretry(t, "dlq", "list", topo.DLQ(), "--json")
	var msgs []map[string]any
	if err := json.Unmarshal([]byte(out), &msgs); code != 0 || err != nil || len(msgs) != 3 {
		t.Fatalf("list --json: exit %d (%s), %v:\n%s", code, errOut, err, out)
	}
	// list shows them by failure time (the last two have none), then by key.
	if ids := idsOf(msgs); !slices.Equal(ids, []string{"order-0", "after", "unreadable"}) {
		t.Errorf("list --json shows %v", ids)
	}
	if reason, _ := msgs[2]["unreadable_headers"].(string); !strings.Contains(reason, "nest deeper than 32") {
		t.Errorf("the unreadable message's unreadable_headers = %q", reason)
	}
	if _, ok := msgs[0]["unreadable_headers"]; ok {
		t.Errorf("message 0 is readable: %v", msgs[0])
	}
	code, out, errOut = amqpretry(t, "dlq", "show", topo.DLQ(), "--id", "after")
	if code != 0 || !strings.Contains(out, "message id:     after") {
		t.Errorf("show --id after: exit %d (%s):\n%s", code, errOut, out)
	}

	code, out, errOut = amqpretry(t, "dlq", "replay", topo.DLQ())
	if code != 0 || !strings.Contains(out, "replayed 2 message(s)") || !strings.Contains(out, "1 with headers amqp091-go cannot read") {
		t.Fatalf("replay: exit %d (%s): %s", code, errOut, out)
	}
	if w, d := brokertest.Depth(t, topo.Queue), brokertest.Depth(t, topo.DLQ()); w != 2 || d != 1 {
		t.Errorf("work %d, dlq %d: want 2 and the unreadable one left", w, d)
	}
}

// A dead letter the broker made is described from its x-death: the original
// routing key and exchange, the queue, when and why, how often (issue 41,
// item 6). list used to show its dead-letter key as the original one, and
// "-" for the rest, so that --match on the original key selected nothing.
func TestBrokerMadeDeadLetterIsDescribedFromXDeath(t *testing.T) {
	work, ex, dlq := brokerDeadLetter(t, "order.created")
	code, out, errOut := amqpretry(t, "dlq", "list", dlq, "--json")
	var msgs []map[string]any
	if err := json.Unmarshal([]byte(out), &msgs); code != 0 || err != nil || len(msgs) != 1 {
		t.Fatalf("list --json: exit %d (%s), %v:\n%s", code, errOut, err, out)
	}
	m := msgs[0]
	if m["routing_key"] != "order.created" || m["original_exchange"] != ex || m["original_queue"] != work || m["attempts"] != 1.0 {
		t.Errorf("list --json: %v", m)
	}
	if e, _ := m["exception"].(string); !strings.Contains(e, "rejected") {
		t.Errorf("exception %q, want x-death's reason", e)
	}
	if at, err := time.Parse(time.RFC3339, fmt.Sprint(m["failed_at"])); err != nil || time.Since(at) > time.Hour {
		t.Errorf("failed_at %v: %v", m["failed_at"], err)
	}
	code, out, errOut = amqpretry(t, "dlq", "list", dlq)
	row := out[strings.Index(out, "\n")+1:]
	if code != 0 || !strings.Contains(row, "order.created") || !strings.Contains(row, "rejected") || !rfc3339Seconds.MatchString(row) {
		t.Errorf("list: exit %d (%s):\n%s", code, errOut, out)
	}
	code, out, errOut = amqpretry(t, "dlq", "show", dlq)
	if code != 0 || !rfc3339Seconds.MatchString(out[strings.Index(out, "failed at:"):]) {
		t.Errorf("show: exit %d (%s):\n%s", code, errOut, out)
	}
	code, out, errOut = amqpretry(t, "dlq", "replay", dlq, "--match", `^order\.created$`, "--to-original-exchange")
	if code != 0 || !strings.Contains(out, "replayed 1 message(s)") {
		t.Fatalf("replay --match --to-original-exchange: exit %d (%s): %s", code, errOut, out)
	}
	if n := brokertest.Depth(t, work); n != 1 {
		t.Errorf("work queue holds %d, want the replayed message", n)
	}
}

// Node code often sets timestamp: Date.now(), milliseconds where AMQP means
// seconds: the time lands in the year 56,000 or so. list --json shows it as
// it is instead of failing for the whole queue (issue 41, item 8);
// encoding/json refuses years past 9999.
func TestListJSONShowsAMillisecondTimestamp(t *testing.T) {
	topo := withDeadLetters(t, 1)
	const dateNow = 1732670000123 // a Date.now(), written as AMQP's seconds
	brokertest.Publish(t, topo.DLQ(), amqp.Publishing{MessageId: "node", Timestamp: time.Unix(dateNow, 0),
		Headers: amqp.Table{recoverer.DefaultHeaderPrefix + recoverer.SuffixFailedAt: time.Unix(dateNow, 0)}})
	code, out, errOut := amqpretry(t, "dlq", "list", topo.DLQ(), "--json")
	var msgs []map[string]any
	if err := json.Unmarshal([]byte(out), &msgs); code != 0 || err != nil || len(msgs) != 2 {
		t.Fatalf("list --json: exit %d (%s), %v:\n%s", code, errOut, err, out)
	}
	want := time.Unix(dateNow, 0).UTC().Format(time.RFC3339)
	if msgs[1]["timestamp"] != want || msgs[1]["failed_at"] != want {
		t.Errorf("timestamp %v, failed_at %v, want both %q", msgs[1]["timestamp"], msgs[1]["failed_at"], want)
	}
	if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(msgs[0]["failed_at"])); err != nil {
		t.Errorf("an ordinary failed_at: %v", err)
	}
	if code, out, _ := amqpretry(t, "dlq", "list", topo.DLQ()); code != 0 || !strings.Contains(out, "node") {
		t.Errorf("list: exit %d:\n%s", code, out)
	}
}

// Over amqps:// too, the DLQ tools read past a message amqp091-go cannot
// parse: amqp091-go does TLS above the socket it dials, so the guard sits
// under a TLS connection made for it. The broker here is behind a
// TLS-terminating proxy with a certificate the URL's cacertfile trusts.
func TestDLQToolsCarryOnPastAnUnreadableDeadLetterOverTLS(t *testing.T) {
	brokertest.Dial(t)
	certFile, keyFile, _ := selfSigned(t)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.StartTLS(brokertest.Addr(), &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	plain, err := proxy.URL(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	amqps := "amqps" + strings.TrimPrefix(plain, "amqp") + "?cacertfile=" + certFile

	q := brokertest.Name(t, "dlq")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "before"},
		amqp.Publishing{MessageId: "unreadable", Headers: amqp.Table{"deep": brokertest.HeadersTooDeep()}},
		amqp.Publishing{MessageId: "after"})
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"dlq", "list", q, "--json", "--url", amqps}, &stdout, &stderr)
	var msgs []map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &msgs); code != 0 || err != nil || len(msgs) != 3 {
		t.Fatalf("list --json over TLS: exit %d (%s), %v:\n%s", code, stderr.String(), err, stdout.String())
	}
	if msgs[2]["unreadable_headers"] == nil || !slices.Equal(idsOf(msgs), []string{"after", "before", "unreadable"}) {
		t.Errorf("list --json over TLS: %v", msgs)
	}
	if n := brokertest.Depth(t, q); n != 3 {
		t.Errorf("the queue holds %d, want its 3 messages back", n)
	}
}

// idsOf is the message_id of each message of list --json.
func idsOf(msgs []map[string]any) []string {
	var ids []string
	for _, m := range msgs {
		id, _ := m["message_id"].(string)
		ids = append(ids, id)
	}
	return ids
}

// brokerDeadLetter is brokertest.BrokerDeadLetter.
func brokerDeadLetter(t *testing.T, key string) (work, ex, dlq string) {
	t.Helper()
	return brokertest.BrokerDeadLetter(t, key)
}
