package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/console"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/recoverer"
)

// dlq summary answers "what failed, how many, since when" in one look:
// the depth, the causes as the console groups them (ids collapsed), each
// with its count, first and last failure and how many are recent; the
// messages stay.
func TestSummaryGroupsByCause(t *testing.T) {
	topo := withDeadLetters(t, 6) // 3 "customer not found", 3 "tax service\ntimed out"
	deadLetter(t, topo, "a", errors.New("order 42 not in stock"))
	deadLetter(t, topo, "b", errors.New("order 43 not in stock"))
	old := time.Now().Add(-2 * time.Hour).UTC()
	brokertest.Publish(t, topo.DLQ(), amqp.Publishing{MessageId: "old", Headers: amqp.Table{
		recoverer.HeaderExceptionMessage: "order 7 not in stock", recoverer.DefaultHeaderPrefix + recoverer.SuffixErrorType: "*errors.errorString",
		recoverer.DefaultHeaderPrefix + recoverer.SuffixOriginalQueue: topo.Queue, recoverer.DefaultHeaderPrefix + recoverer.SuffixFailedAt: old.Format(time.RFC3339Nano)}})
	code, out, errOut := amqpretry(t, "dlq", "summary", topo.DLQ(), "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var s struct {
		Depth, Recent int
		FirstFailed   time.Time `json:"first_failed"`
		Groups        []struct {
			ID, Cause     string
			ErrorType     string `json:"error_type"`
			Count, Recent int
		}
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if s.Depth != 9 || s.Recent != 8 || s.FirstFailed.Sub(old).Abs() > time.Second {
		t.Errorf("depth %d (want 9), recent %d (want 8), first failed %v (want %v):\n%s", s.Depth, s.Recent, s.FirstFailed, old, out)
	}
	got := map[string][2]int{}
	for _, g := range s.Groups {
		got[g.Cause] = [2]int{g.Count, g.Recent}
		if g.ID == "" || g.ErrorType != "*errors.errorString" {
			t.Errorf("group %q: id %q, error type %q", g.Cause, g.ID, g.ErrorType)
		}
	}
	if len(s.Groups) != 3 || s.Groups[0].Count != 3 || got["order <n> not in stock"] != [2]int{3, 2} {
		t.Errorf("groups (count, recent) by cause: %v, want 3 causes, \"order <n> not in stock\" 3 of which 2 recent:\n%s", got, out)
	}
	code, out, errOut = amqpretry(t, "dlq", "summary", topo.DLQ())
	for _, w := range []string{": 9 dead letter(s); 8 failed in the last 15m0s", "customer not found", "tax service timed out", "3 cause(s)"} {
		if code != 0 || !strings.Contains(out, w) {
			t.Errorf("summary: exit %d, lacks %q:\n%s%s", code, w, out, errOut)
		}
	}
	if n := brokertest.Depth(t, topo.DLQ()); n != 9 {
		t.Errorf("the DLQ holds %d after a summary, want 9", n)
	}
}

// summary's groups are the console's: the same ids for the same dead
// letters, a broker-made one (x-death only) among them.
func TestSummaryGroupsAsTheConsoleDoes(t *testing.T) {
	_, _, dlq := brokerDeadLetter(t, "order.created")
	topo := withDeadLetters(t, 0)
	for id, cause := range map[string]error{"a": errors.New("order 42 not in stock"), "b": errors.New("order 43 not in stock"), "c": errors.New("tax\tservice down")} {
		deadLetter(t, topo, id, cause)
	}
	for _, q := range []string{dlq, topo.DLQ()} {
		code, out, errOut := amqpretry(t, "dlq", "summary", q, "--json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var s struct{ Groups []struct{ ID string } }
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatal(err)
		}
		var ours []string
		for _, g := range s.Groups {
			ours = append(ours, g.ID)
		}
		c, err := console.New(console.Config{URLs: []string{brokertest.URL()}, Queues: []string{q}, Tokens: map[string]string{"test": "a-token-of-sixteen-bytes"}, Audit: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		snap, err := c.Snapshot(context.Background(), q, true)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		var theirs []string
		for _, g := range console.Groups(snap.Messages, console.ByCause) {
			theirs = append(theirs, g.ID)
		}
		if !slices.Equal(ours, theirs) {
			t.Errorf("%s: summary's groups %v, the console's %v", q, ours, theirs)
		}
	}
}
