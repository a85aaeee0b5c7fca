package main

import (
	"encoding/json"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/recoverer"
)

// tooDeep is a header value amqp091-go cannot read (tables nested 33 deep,
// which pika sends and RabbitMQ takes), written with amqp091-go's own table
// writer.
func tooDeep() amqp.Table {
	v := amqp.Table{"leaf": "x"}
	for range 32 {
		v = amqp.Table{"d": v}
	}
	return v
}

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
		amqp.Publishing{MessageId: "unreadable", Headers: origin(amqp.Table{"deep": tooDeep()})},
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
	if reason, _ := msgs[1]["unreadable_headers"].(string); !strings.Contains(reason, "nest deeper than 32") {
		t.Errorf("message 1's unreadable_headers = %q", reason)
	}
	if _, ok := msgs[0]["unreadable_headers"]; ok {
		t.Errorf("message 0 is readable: %v", msgs[0])
	}
	code, out, errOut = amqpretry(t, "dlq", "show", topo.DLQ(), "--index", "2")
	if code != 0 || !strings.Contains(out, "message id:     after") {
		t.Errorf("show --index 2: exit %d (%s):\n%s", code, errOut, out)
	}

	code, out, errOut = amqpretry(t, "dlq", "replay", topo.DLQ())
	if code != 0 || !strings.Contains(out, "replayed 2 message(s)") || !strings.Contains(out, "1 with headers amqp091-go cannot read") {
		t.Fatalf("replay: exit %d (%s): %s", code, errOut, out)
	}
	if w, d := brokertest.Depth(t, topo.Queue), brokertest.Depth(t, topo.DLQ()); w != 2 || d != 1 {
		t.Errorf("work %d, dlq %d: want 2 and the unreadable one left", w, d)
	}
}
