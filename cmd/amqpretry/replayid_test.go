package main

import (
	"strings"
	"testing"

	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// replay --id takes the message with that exact id, and nothing else: not
// one whose body, exception or another id merely contains it (as --match
// would). An id that selects nothing says so and fails.
func TestReplayOneMessageByID(t *testing.T) {
	topo := withDeadLetters(t, 12) // order-0 … order-11: "order-1" is inside "order-10" and "order-11"
	code, out, errOut := amqpretry(t, "dlq", "replay", topo.DLQ(), "--id", "order-1")
	if code != 0 || !strings.Contains(out, "replayed 1 message(s)") {
		t.Fatalf("exit %d (%s): %s", code, errOut, out)
	}
	if w, d := brokertest.Depth(t, topo.Queue), brokertest.Depth(t, topo.DLQ()); w != 1 || d != 11 {
		t.Fatalf("work %d, dlq %d: want 1 and 11", w, d)
	}
	code, out, errOut = amqpretry(t, "dlq", "replay", topo.DLQ(), "--id", "order-99")
	if code != 1 || !strings.Contains(errOut, `no message with id "order-99"`) {
		t.Errorf("an id that is not there: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
