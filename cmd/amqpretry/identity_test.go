package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// A quorum DLQ reorders at each look (a message handed back goes behind
// those never taken): list shows the dead letters by failure time whatever
// their order on the queue, and names each by a key that does not move
// (issue 40: after list --limit 3, list showed 3…9, 0, 1, 2, and show
// --index i printed the wrong message).
func TestListIsInFailureOrderWhateverTheQueueOrder(t *testing.T) {
	const n = 10
	topo := quorumDeadLetters(t, n)
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("order-%d", i))
	}
	for look := range 4 {
		if code, out, errOut := amqpretry(t, "dlq", "list", topo.DLQ(), "--limit", "3"); code != 0 {
			t.Fatalf("list --limit 3: exit %d: %s%s", code, out, errOut)
		}
		code, out, errOut := amqpretry(t, "dlq", "list", topo.DLQ(), "--json")
		if code != 0 {
			t.Fatalf("list: exit %d: %s", code, errOut)
		}
		var rows []struct {
			Index     int    `json:"index"`
			Key       string `json:"key"`
			MessageID string `json:"message_id"`
		}
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatal(err)
		}
		var got []string
		for i, r := range rows {
			got = append(got, r.MessageID)
			if r.Index != i || r.Key != "id:"+r.MessageID {
				t.Errorf("row %d: index %d, key %q", i, r.Index, r.Key)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("look %d: list shows %v, want them by failure time %v", look, got, want)
		}
	}
	for i := range n {
		code, out, errOut := amqpretry(t, "dlq", "show", topo.DLQ(), "--key", fmt.Sprintf("id:order-%d", i))
		if wantLine := fmt.Sprintf("message id:     order-%d\n", i); code != 0 || !strings.Contains(out, wantLine) {
			t.Errorf("show --key id:order-%d: exit %d:\n%s%s", i, code, out, errOut)
		}
	}
}

// A dead letter without a message id is named by a fingerprint of its body,
// properties and headers (the console's key), which show --key takes.
func TestShowByFingerprint(t *testing.T) {
	topo := withDeadLetters(t, 1)
	brokertest.Publish(t, topo.DLQ(), amqp.Publishing{Body: []byte("no id")})
	code, out, errOut := amqpretry(t, "dlq", "list", topo.DLQ(), "--match", "no id", "--json")
	var rows []struct{ Key string }
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil || len(rows) != 1 || !strings.HasPrefix(rows[0].Key, "fp:") {
		t.Fatalf("list: exit %d, %v: %s%s", code, err, out, errOut)
	}
	for range 2 {
		code, out, errOut = amqpretry(t, "dlq", "show", topo.DLQ(), "--key", rows[0].Key)
		if code != 0 || !strings.Contains(out, "no id") {
			t.Errorf("show --key %s: exit %d:\n%s%s", rows[0].Key, code, out, errOut)
		}
	}
	code, _, errOut = amqpretry(t, "dlq", "show", topo.DLQ(), "--index", "1")
	if code != 2 || !strings.Contains(errOut, "--key") {
		t.Errorf("show --index: exit %d, want 2 and what to use instead: %s", code, errOut)
	}
}

// replay --limit N replays the N oldest failures, wherever looks have left
// them on a quorum DLQ (issue 40: it replayed an arbitrary N).
func TestReplayLimitTakesTheOldestFailures(t *testing.T) {
	const n = 10
	topo := quorumDeadLetters(t, n)
	to := brokertest.Name(t, "to")
	brokertest.Queue(t, to, nil)
	t.Cleanup(func() { brokertest.DeleteQueue(t, to) })
	for range 2 { // on RabbitMQ 4.3, puts order-0…2 behind the rest
		for _, args := range [][]string{{"--limit", "3"}, nil} {
			if code, out, errOut := amqpretry(t, append([]string{"dlq", "list", topo.DLQ()}, args...)...); code != 0 {
				t.Fatalf("list %v: exit %d: %s%s", args, code, out, errOut)
			}
		}
	}
	code, out, errOut := amqpretry(t, "dlq", "replay", topo.DLQ(), "--limit", "3", "--to", to, "--dry-run")
	if code != 0 || !strings.Contains(out, "order-0") || !strings.Contains(out, "order-2") || strings.Contains(out, "order-3") {
		t.Errorf("dry run --limit 3: exit %d, want order-0…2:\n%s%s", code, out, errOut)
	}
	if code, out, errOut := amqpretry(t, "dlq", "replay", topo.DLQ(), "--limit", "3", "--to", to); code != 0 || !strings.Contains(out, "replayed 3 message(s)") {
		t.Fatalf("replay --limit 3: exit %d:\n%s%s", code, out, errOut)
	}
	var got []string
	for _, d := range drainQueue(t, to) {
		got = append(got, d.MessageId)
	}
	slices.Sort(got)
	if want := []string{"order-0", "order-1", "order-2"}; !slices.Equal(got, want) {
		t.Errorf("replay --limit 3 moved %v, want the oldest failures %v", got, want)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != n-3 {
		t.Errorf("the DLQ holds %d, want %d", d, n-3)
	}
}
