package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The CLI's part of issue 40's incident drill: a listener fills a quorum
// DLQ with three causes (a payment API that times out, bad JSON, blocked
// customers); the operator runs summary, a dry run of one cause, and the
// replay of that cause, the archive of another cause (dlq delete) and its
// restore, and every message is accounted for: the replayed on the work
// queue, the rest on the DLQ (the restored with their fault headers) or,
// between delete and restore, in the archive, none twice, none lost, and
// an audit line names each action's messages.
func TestIncidentDrill(t *testing.T) {
	const perCause = 10
	topo := dlx.Topology{Queue: brokertest.Name(t, "payments"), Type: dlx.Quorum}
	t.Cleanup(func() {
		brokertest.DeleteQueue(t, topo.Queue)
		brokertest.DeleteQueue(t, topo.DLQ())
		brokertest.DeleteQueue(t, topo.DLQ()+".archive")
	})
	if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	pub, err := publisher.New(brokertest.URL(), publisher.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	chain := middleware.Chain(
		middleware.Retry(2, middleware.WithInitialInterval(time.Millisecond)),
		middleware.Recover(recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())),
	)
	work, err := listener.New(topo.Queue, chain, func(ctx context.Context, d *amqp.Delivery) error {
		var p struct{ Customer int }
		if err := json.Unmarshal(d.Body, &p); err != nil {
			return fmt.Errorf("payment %s: %w", d.MessageId, err)
		}
		switch {
		case strings.HasPrefix(d.MessageId, "slow-"):
			return fmt.Errorf("charge customer %d: %w", p.Customer, context.DeadlineExceeded)
		default:
			return middleware.Permanent(fmt.Errorf("customer %d is blocked", p.Customer))
		}
	}, listener.WithURL(brokertest.URL()), listener.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- work.Run(ctx) }()
	var all []string
	for i := range perCause {
		for _, m := range []amqp.Publishing{
			{MessageId: fmt.Sprintf("slow-%d", i), Body: []byte(fmt.Sprintf(`{"customer":%d}`, i))},
			{MessageId: fmt.Sprintf("bad-%d", i), Body: []byte(`{"customer":`)},
			{MessageId: fmt.Sprintf("blocked-%d", i), Body: []byte(fmt.Sprintf(`{"customer":%d}`, 100+i))},
		} {
			if err := pub.Publish(context.Background(), "", topo.Queue, m); err != nil {
				t.Fatal(err)
			}
			all = append(all, m.MessageId)
		}
	}
	brokertest.Eventually(t, 30*time.Second, "every payment dead-lettered", func() bool { return brokertest.Depth(t, topo.DLQ()) == 3*perCause })
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the listener: %v", err)
	}

	code, out, errOut := amqpretry(t, "dlq", "summary", topo.DLQ(), "--json")
	var s struct {
		Depth  int
		Groups []struct {
			Count     int
			ErrorType string `json:"error_type"`
			Cause     string
		}
	}
	if err := json.Unmarshal([]byte(out), &s); code != 0 || err != nil {
		t.Fatalf("summary: exit %d, %v: %s%s", code, err, out, errOut)
	}
	if s.Depth != 3*perCause || len(s.Groups) != 3 || s.Groups[0].Count != perCause || s.Groups[2].Count != perCause {
		t.Errorf("summary: depth %d, groups %+v; want 3 causes of %d", s.Depth, s.Groups, perCause)
	}
	code, out, errOut = amqpretry(t, "dlq", "replay", topo.DLQ(), "--match", "DEADLINE", "--dry-run")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("would replay %d message(s)", perCause)) {
		t.Fatalf("dry run: exit %d: %s%s", code, out, errOut)
	}
	if n := brokertest.Depth(t, topo.DLQ()); n != 3*perCause {
		t.Fatalf("a dry run moved messages: the DLQ holds %d", n)
	}
	auditLog := filepath.Join(t.TempDir(), "audit.log")
	code, out, errOut = amqpretry(t, "dlq", "replay", topo.DLQ(), "--match", "deadline", "--audit", auditLog)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("replayed %d message(s)", perCause)) {
		t.Fatalf("replay: exit %d: %s%s", code, out, errOut)
	}

	// Blocked customers are not worth a replay: archived, then restored
	// once someone asks for them after all.
	archive := topo.DLQ() + ".archive"
	code, out, errOut = amqpretry(t, "dlq", "delete", topo.DLQ(), "--match", "is blocked", "--archive-type", "quorum", "--audit", auditLog)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("archived %d message(s)", perCause)) {
		t.Fatalf("delete: exit %d: %s%s", code, out, errOut)
	}
	if w, d, a := brokertest.Depth(t, topo.Queue), brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, archive); w != perCause || d != perCause || a != perCause || w+d+a != len(all) {
		t.Fatalf("after the delete: work %d, DLQ %d, archive %d; want %d each", w, d, a, perCause)
	}
	code, out, errOut = amqpretry(t, "dlq", "restore", topo.DLQ(), "--match", "blocked", "--audit", auditLog)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("restored %d message(s)", perCause)) {
		t.Fatalf("restore: exit %d: %s%s", code, out, errOut)
	}
	if a := brokertest.Depth(t, archive); a != 0 {
		t.Errorf("the archive holds %d after the restore", a)
	}

	var back, still []string
	for _, d := range drainQueue(t, topo.Queue) {
		back = append(back, d.MessageId)
	}
	for _, d := range drainQueue(t, topo.DLQ()) {
		still = append(still, d.MessageId)
		if exc, _ := d.Headers[recoverer.HeaderExceptionMessage].(string); exc == "" {
			t.Errorf("%s is back on the DLQ without its exception: %v", d.MessageId, d.Headers)
		}
		for k := range d.Headers {
			if strings.Contains(k, "archived") {
				t.Errorf("%s kept the archive's %s", d.MessageId, k)
			}
		}
	}
	for _, id := range back {
		if !strings.HasPrefix(id, "slow-") {
			t.Errorf("%s was replayed: it is not a timeout", id)
		}
	}
	got := append(slices.Clone(back), still...)
	slices.Sort(got)
	slices.Sort(all)
	if len(back) != perCause || !slices.Equal(got, all) {
		t.Errorf("%d replayed, %d still dead letters; accounted for %d of %d, want each once", len(back), len(still), len(got), len(all))
	}
	lines := auditLines(t, auditLog)
	if len(lines) != 3 {
		t.Fatalf("the audit log has %d lines, want replay, delete, restore: %+v", len(lines), lines)
	}
	for i, action := range []string{"replay", "delete", "restore"} {
		if l := lines[i]; l.Action != action || len(l.Messages) != perCause || l.Done != perCause {
			t.Errorf("audit line %d: %+v, want a %s of %d", i, l, action, perCause)
		}
	}
}
