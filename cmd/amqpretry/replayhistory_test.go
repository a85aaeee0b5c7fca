package main

import (
	"strings"
	"testing"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/recoverer"
)

// A message replayed from the command line keeps its history, as the
// console's replays do: how often it was replayed and what it failed with,
// so that if it fails again its dead letter shows both.
func TestReplayKeepsHistory(t *testing.T) {
	topo := withDeadLetters(t, 3)
	code, out, errOut := amqpretry(t, "dlq", "replay", topo.DLQ(), "--id", "order-0")
	if code != 0 || !strings.Contains(out, "replayed 1 message(s)") {
		t.Fatalf("exit %d (%s): %s", code, errOut, out)
	}
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), topo.Queue)
	if !ok {
		t.Fatal("nothing on the work queue")
	}
	p := recoverer.DefaultHeaderPrefix
	if n := d.Headers[p+dlx.SuffixReplayed]; n != int64(1) {
		t.Errorf("%s = %v, want 1", p+dlx.SuffixReplayed, n)
	}
	if e, _ := d.Headers[p+dlx.SuffixPreviousException].(string); !strings.Contains(e, "customer not found") {
		t.Errorf("%s = %q, want the exception it failed with", p+dlx.SuffixPreviousException, e)
	}
	if _, fault := d.Headers[recoverer.HeaderExceptionMessage]; fault {
		t.Error("the replayed copy still has its fault headers")
	}
}
