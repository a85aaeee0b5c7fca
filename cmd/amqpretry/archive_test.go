package main

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/recoverer"
)

// dlq delete --id archives that message alone with its headers and the
// archive's; dlq restore --key brings it back without the archive's; an
// archive named as the queue to delete from is refused (purge is for
// good).
func TestDeleteArchivesAndRestoreByKey(t *testing.T) {
	topo := withDeadLetters(t, 5)
	archive := topo.DLQ() + ".archive"
	t.Cleanup(func() { brokertest.DeleteQueue(t, archive) })
	code, out, errOut := amqpretry(t, "dlq", "delete", topo.DLQ(), "--id", "order-3", "--no-audit")
	if code != 0 || !strings.Contains(out, "archived 1 message(s)") {
		t.Fatalf("delete: exit %d (%s): %s", code, errOut, out)
	}
	if d, a := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, archive); d != 4 || a != 1 {
		t.Fatalf("DLQ %d, archive %d: want 4 and 1", d, a)
	}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	m, ok, err := ch.Get(archive, false)
	if err != nil || !ok {
		t.Fatalf("the archive: %v %v", ok, err)
	}
	for _, k := range []string{recoverer.HeaderExceptionMessage, "x-amqpretry-archived-at", "x-amqpretry-archived-by", "x-amqpretry-archived-from"} {
		if _, ok := m.Headers[k]; !ok {
			t.Errorf("the archived copy lacks %s: %v", k, m.Headers)
		}
	}
	_ = m.Nack(false, true)
	brokertest.Eventually(t, 5e9, "the message back on the archive", func() bool { return brokertest.Depth(t, archive) == 1 })

	if code, _, errOut := amqpretry(t, "dlq", "delete", archive, "--no-audit"); code != 2 || !strings.Contains(errOut, "purge") {
		t.Errorf("a delete from an archive: exit %d: %s", code, errOut)
	}
	code, out, errOut = amqpretry(t, "dlq", "restore", topo.DLQ(), "--key", "id:order-3", "--no-audit")
	if code != 0 || !strings.Contains(out, "restored 1 message(s)") {
		t.Fatalf("restore: exit %d (%s): %s", code, errOut, out)
	}
	if d, a := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, archive); d != 5 || a != 0 {
		t.Fatalf("DLQ %d, archive %d after the restore: want 5 and 0", d, a)
	}
	for range 5 {
		m, _ := brokertest.Get(t, ch, topo.DLQ())
		for k := range m.Headers {
			if strings.Contains(k, "archived") {
				t.Errorf("%s kept %s", m.MessageId, k)
			}
		}
	}
}

// A copy the archive refuses (full, reject-publish: the broker nacks it)
// leaves the message on the DLQ, and the command fails.
func TestDeleteTheArchiveRefusesKeepsTheMessage(t *testing.T) {
	topo := withDeadLetters(t, 2)
	archive := topo.DLQ() + ".archive"
	t.Cleanup(func() { brokertest.DeleteQueue(t, archive) })
	brokertest.Queue(t, archive, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	code, out, errOut := amqpretry(t, "dlq", "delete", topo.DLQ(), "--no-audit")
	if code != 1 {
		t.Errorf("exit %d, want 1: %s%s", code, out, errOut)
	}
	if d, a := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, archive); d != 2 || a != 0 {
		t.Errorf("DLQ %d, archive %d: want both messages still on the DLQ", d, a)
	}
}
