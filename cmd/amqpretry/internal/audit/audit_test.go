package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/console"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDefaultPath(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", "/state")
	if got := DefaultPath(); got != "/state/amqpretry/audit.log" {
		t.Errorf("with $XDG_STATE_HOME: %q", got)
	}
	t.Setenv("XDG_STATE_HOME", "relative") // the XDG spec ignores a relative one
	t.Setenv("HOME", "/home/op")
	if got := DefaultPath(); got != filepath.Join("/home/op", ".local", "state", "amqpretry", "audit.log") {
		t.Errorf("without: %q", got)
	}
}

// A line lists at most MaxKeys keys, escaped, and counts the rest.
func TestRecordBoundsAndEscapesKeys(t *testing.T) {
	var buf bytes.Buffer
	log, err := Open(Stderr, &buf)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"id:\x1b[31mred"}
	for i := range MaxKeys + 4 {
		keys = append(keys, fmt.Sprintf("id:%d", i))
	}
	if err := log.Record(console.AuditEntry{Action: "replay", Messages: keys}); err != nil {
		t.Fatal(err)
	}
	var e console.AuditEntry
	if err := json.Unmarshal(buf.Bytes(), &e); err != nil {
		t.Fatal(err)
	}
	if len(e.Messages) != MaxKeys || e.MessagesNotListed != 5 || e.Messages[0] != `id:\x1b[31mred` || e.Who == "" || e.Time.IsZero() {
		t.Errorf("%d keys listed, %d not, first %q, who %q", len(e.Messages), e.MessagesNotListed, e.Messages[0], e.Who)
	}
}
