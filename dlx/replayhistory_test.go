package dlx_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/recoverer"
)

// ReplayKeepHistory: the replayed copy loses its fault headers but counts
// its replays and keeps the last failure, its exception cut on a character
// boundary to MaxPreviousException bytes; a copy that fails again and is
// replayed again counts 2 and keeps the newer failure.
func TestReplayKeepHistory(t *testing.T) {
	topo := topology(t, dlx.Topology{})
	declare(t, topo)
	pub := newPublisher(t)
	rep := recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())
	ch := brokertest.Channel(t, brokertest.Dial(t))
	// A long exception of two-byte characters: a cut at a byte count
	// lands inside one unless it looks for the boundary.
	long := "x" + strings.Repeat("é", dlx.MaxPreviousException)
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "order-17", Body: []byte("{}")})
	prefix := recoverer.DefaultHeaderPrefix
	for round, cause := range []string{long, "customer 1042 still not found"} {
		d, ok := brokertest.Get(t, ch, topo.Queue)
		if !ok {
			t.Fatalf("round %d: nothing on the work queue", round+1)
		}
		if err := rep.Recover(chainrun.WithQueue(context.Background(), topo.Queue), &d, errors.New(cause)); err != nil {
			t.Fatal(err)
		}
		brokertest.Eventually(t, 10*time.Second, "the dead letter", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
		stats, err := dlx.Replay(context.Background(), ch, pub, topo.DLQ(), dlx.ReplayKeepHistory())
		if err != nil || stats.Replayed != 1 {
			t.Fatalf("round %d: replay %+v, %v", round+1, stats, err)
		}
		brokertest.Eventually(t, 10*time.Second, "the replayed copy", func() bool { return brokertest.Depth(t, topo.Queue) == 1 })
		// Take the copy, and put it back for the next round to fail again.
		got, ok := brokertest.Get(t, ch, topo.Queue)
		if !ok {
			t.Fatalf("round %d: the replayed copy is not on the work queue", round+1)
		}
		brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: got.MessageId, Body: got.Body, Headers: got.Headers})
		h := got.Headers
		if n, _ := h[prefix+dlx.SuffixReplayed].(int64); n != int64(round+1) {
			t.Errorf("round %d: %s = %v, want %d", round+1, prefix+dlx.SuffixReplayed, h[prefix+dlx.SuffixReplayed], round+1)
		}
		exc, _ := h[prefix+dlx.SuffixPreviousException].(string)
		if round == 0 {
			if !utf8.ValidString(exc) || len(exc) > dlx.MaxPreviousException+len("…") || !strings.HasSuffix(exc, "é…") {
				t.Errorf("round 1: the previous exception is %d bytes, valid UTF-8 %v, ends %q", len(exc), utf8.ValidString(exc), exc[max(0, len(exc)-8):])
			}
		} else if exc != cause {
			t.Errorf("round 2: the previous exception is %q, want %q", exc, cause)
		}
		if et, _ := h[prefix+dlx.SuffixPreviousErrorType].(string); et != "*errors.errorString" {
			t.Errorf("round %d: previous error type %q", round+1, et)
		}
		if at, _ := h[prefix+dlx.SuffixPreviousFailedAt].(string); at == "" {
			t.Errorf("round %d: no previous failure time", round+1)
		}
		for _, k := range []string{recoverer.HeaderExceptionMessage, recoverer.HeaderExceptionStacktrace, prefix + recoverer.SuffixErrorType} {
			if _, ok := h[k]; ok {
				t.Errorf("round %d: %s survived the replay", round+1, k)
			}
		}
	}
}
