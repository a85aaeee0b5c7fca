package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/audit"
	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/console"
	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// auditLines reads the audit log at path.
func auditLines(t *testing.T, path string) []console.AuditEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("the audit log: %v", err)
	}
	defer f.Close()
	var out []console.AuditEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e console.AuditEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("an audit line that is not the console's JSON: %v\n%s", err, sc.Text())
		}
		out = append(out, e)
	}
	return out
}

// Every CLI action writes the console's audit line, who (the OS user),
// what, which messages, outcome, to --audit FILE; a dry run, a look and
// --no-audit write none (issue 40: CLI replays and purges left no trace).
func TestReplayAndPurgeWriteAnAuditLine(t *testing.T) {
	topo := withDeadLetters(t, 4)
	path := filepath.Join(t.TempDir(), "audit.log")
	if code, _, errOut := amqpretry(t, "dlq", "replay", topo.DLQ(), "--match", "customer", "--audit", path); code != 0 {
		t.Fatalf("replay: exit %d: %s", code, errOut)
	}
	for _, args := range [][]string{
		{"dlq", "replay", topo.DLQ(), "--dry-run", "--audit", path},
		{"dlq", "list", topo.DLQ()},
		{"dlq", "replay", topo.DLQ(), "--id", "order-1", "--no-audit", "--audit", path},
	} {
		if code, _, errOut := amqpretry(t, args...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
	}
	if code, _, errOut := amqpretry(t, "dlq", "replay", topo.DLQ(), "--match", "no such thing", "--audit", path); code != 1 {
		t.Fatalf("replay selecting nothing: exit %d: %s", code, errOut)
	}
	if code, _, errOut := amqpretry(t, "dlq", "purge", topo.DLQ(), "--yes", "--audit", path); code != 0 {
		t.Fatalf("purge: exit %d: %s", code, errOut)
	}
	lines := auditLines(t, path)
	if len(lines) != 3 {
		t.Fatalf("%d audit lines, want 3 (replay, the replay that selected nothing, purge): %+v", len(lines), lines)
	}
	r, none, p := lines[0], lines[1], lines[2]
	if r.Action != "replay" || r.Who != audit.Who() || r.Queue != topo.DLQ() || !slices.Equal(r.Messages, []string{"id:order-0", "id:order-2"}) ||
		r.Requested != 2 || r.Done != 2 || r.Left != 0 || r.Outcome != "ok" || r.Time.IsZero() {
		t.Errorf("the replay's line: %+v", r)
	}
	if none.Action != "replay" || none.Outcome != "failed" || !strings.Contains(none.Error, "no message matching") || none.Done != 0 {
		t.Errorf("the line of a replay that selected nothing: %+v", none)
	}
	if p.Action != "purge" || p.Done != 1 || p.Requested != 1 || p.Outcome != "ok" || p.Who != audit.Who() {
		t.Errorf("the purge's line (1 left after replaying 3): %+v", p)
	}
}

// Without --audit the line goes to $XDG_STATE_HOME/amqpretry/audit.log;
// a log that cannot be written stops the action before it begins.
func TestAuditIsOnByDefault(t *testing.T) {
	topo := withDeadLetters(t, 2)
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	if code, _, errOut := amqpretry(t, "dlq", "replay", topo.DLQ(), "--id", "order-0"); code != 0 {
		t.Fatalf("replay: exit %d: %s", code, errOut)
	}
	if lines := auditLines(t, filepath.Join(state, "amqpretry", "audit.log")); len(lines) != 1 || lines[0].Done != 1 {
		t.Errorf("the default audit log: %+v", lines)
	}
	blocked := filepath.Join(state, "a-file")
	if err := os.WriteFile(blocked, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := amqpretry(t, "dlq", "purge", topo.DLQ(), "--yes", "--audit", filepath.Join(blocked, "audit.log"))
	if code != 1 || !strings.Contains(errOut, "--no-audit; nothing was done") {
		t.Errorf("an audit log that cannot be opened: exit %d: %s", code, errOut)
	}
	if n := brokertest.Depth(t, topo.DLQ()); n != 1 {
		t.Errorf("the DLQ holds %d, want 1: a purge without its audit line must not run", n)
	}
}
