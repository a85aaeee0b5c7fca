package main

import (
	"bytes"
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Help is asked for, so it goes to standard output with exit status 0: the
// overview for help, -h and --help; a group's commands for dlq --help; a
// command's usage and its own flags, only those, for CMD --help, CMD -h and
// help CMD.
func TestHelp(t *testing.T) {
	tests := []struct {
		args    []string
		want    []string
		notWant []string
	}{
		{[]string{"help"}, []string{"usage: amqpretry COMMAND", "dlq list", "outbox counts", "version"}, nil},
		{[]string{"--help"}, []string{"usage: amqpretry COMMAND"}, nil},
		{[]string{"-h"}, []string{"usage: amqpretry COMMAND"}, nil},
		{[]string{"dlq", "--help"}, []string{"usage: amqpretry dlq COMMAND", "dlq replay", "dlq purge"}, []string{"outbox list"}},
		{[]string{"outbox", "-h"}, []string{"usage: amqpretry outbox COMMAND", "outbox show", "outbox counts"}, []string{"dlq list"}},
		{[]string{"help", "outbox"}, []string{"usage: amqpretry outbox COMMAND"}, []string{"dlq list"}},
		{[]string{"dlq", "list", "--help"}, []string{"usage: amqpretry dlq list QUEUE", "--limit N", "--json", "--url URL", "(default 100)", "message_id"}, []string{"--to", "--yes", "--dsn"}},
		{[]string{"dlq", "list", "q", "-h"}, []string{"usage: amqpretry dlq list QUEUE"}, nil},
		{[]string{"help", "dlq", "list"}, []string{"usage: amqpretry dlq list QUEUE", "--limit N"}, nil},
		{[]string{"dlq", "replay", "--help"}, []string{"--to QUEUE", "--to-original-exchange", "--match REGEXP"}, []string{"--json"}},
		{[]string{"outbox", "list", "--help"}, []string{"usage: amqpretry outbox list", "--failed", "--dsn DSN", "last_error"}, []string{"--url"}},
		{[]string{"help", "version"}, []string{"usage: amqpretry version"}, nil},
	}
	for _, tt := range tests {
		code, out, errOut := cli(tt.args...)
		if code != 0 || errOut != "" {
			t.Errorf("amqpretry %q: exit %d, stderr %q; want 0 and nothing", tt.args, code, errOut)
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("amqpretry %q: stdout lacks %q:\n%s", tt.args, w, out)
			}
		}
		for _, w := range tt.notWant {
			if strings.Contains(out, w) {
				t.Errorf("amqpretry %q: stdout has %q, another command's:\n%s", tt.args, w, out)
			}
		}
	}
}

// Every command has a one-line description in the overview and answers
// --help with its own usage, without doing anything.
func TestEveryCommandHasHelp(t *testing.T) {
	_, overview, _ := cli("help")
	for _, c := range commands {
		if c.summary == "" || strings.Contains(c.summary, "\n") || !strings.Contains(overview, c.summary) {
			t.Errorf("%s: its one-line summary %q is not in the overview", c.name, c.summary)
		}
		if !strings.HasPrefix(c.usage, "amqpretry "+c.name) {
			t.Errorf("%s: its usage does not begin with the synopsis: %q", c.name, c.usage)
		}
		code, out, errOut := cli(append(strings.Fields(c.name), "--help")...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: amqpretry "+c.name) {
			t.Errorf("%s --help: exit %d, stderr %q, stdout %q", c.name, code, errOut, out)
		}
	}
}

// A mistake on the command line: exit status 2, on standard error, what is
// wrong and the synopsis of that command only, never the whole usage.
func TestUsageErrorsShowTheirCommandOnly(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{nil, []string{"usage: amqpretry COMMAND"}},
		{[]string{"frob"}, []string{`unknown command "frob"`, "amqpretry help"}},
		{[]string{"dlq"}, []string{"amqpretry dlq: which command?", "dlq list"}},
		{[]string{"dlq", "frob", "q"}, []string{`unknown command "dlq frob"`, "dlq replay"}},
		{[]string{"help", "frob"}, []string{`no command "frob"`}},
		{[]string{"dlq", "list"}, []string{"amqpretry dlq list: which QUEUE?", "usage: amqpretry dlq list QUEUE", "amqpretry dlq list --help"}},
		{[]string{"dlq", "list", "a", "b"}, []string{"expected one QUEUE, got 2 arguments"}},
		{[]string{"dlq", "list", "q", "--to", "x"}, []string{"flag provided but not defined: -to", "usage: amqpretry dlq list QUEUE"}},
		{[]string{"dlq", "list", "q", "--limit", "-1"}, []string{"--limit expects 1 or more, got -1", "usage: amqpretry dlq list"}},
		{[]string{"dlq", "list", "q", "--limit", "0"}, []string{"--limit expects 1 or more, got 0"}},
		{[]string{"dlq", "replay", "q", "--limit", "-1"}, []string{"--limit expects 1 or more (or 0, the default: every message), got -1", "usage: amqpretry dlq replay"}},
		{[]string{"dlq", "show", "q", "--index", "2"}, []string{"--index is gone", "use --id MESSAGE_ID or --key KEY"}},
		{[]string{"dlq", "show", "q", "--key", "id:x", "--id", "x"}, []string{"--id or --key, not both"}},
		{[]string{"dlq", "replay", "q", "--match", "("}, []string{"--match"}},
		{[]string{"dlq", "replay", "q", "--to", "a", "--to-original-exchange"}, []string{"not both"}},
		{[]string{"dlq", "purge", "q"}, []string{"add --yes", "usage: amqpretry dlq purge QUEUE --yes"}},
		{[]string{"outbox", "list", "--limit", "-1"}, []string{"--limit expects 1 or more, got -1", "usage: amqpretry outbox list"}},
		{[]string{"outbox", "show"}, []string{"show expects one row ID (amqpretry outbox list shows them)", "usage: amqpretry outbox show ID"}},
		{[]string{"version", "x"}, []string{"version takes no arguments"}},
	}
	for _, tt := range tests {
		code, out, errOut := cli(tt.args...)
		if code != 2 || out != "" {
			t.Errorf("amqpretry %q: exit %d, stdout %q; want 2 and nothing", tt.args, code, out)
		}
		for _, w := range tt.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("amqpretry %q: stderr lacks %q:\n%s", tt.args, w, errOut)
			}
		}
		// Only the command's own synopsis: no other command's.
		if len(tt.args) >= 2 && find(tt.args[0]+" "+tt.args[1]) != nil {
			for _, c := range commands {
				if c.name != tt.args[0]+" "+tt.args[1] && strings.Contains(errOut, "usage: amqpretry "+c.name) {
					t.Errorf("amqpretry %q: stderr shows the usage of %s too:\n%s", tt.args, c.name, errOut)
				}
			}
		}
	}
}

func TestVersion(t *testing.T) {
	code, out, errOut := cli("version")
	// A test binary carries no module version: a build of a checkout.
	if code != 0 || errOut != "" || !strings.HasPrefix(out, "amqpretry (devel) (go") {
		t.Errorf("version: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, tt := range []struct {
		info *debug.BuildInfo
		want string
	}{
		{nil, "(devel)"},
		{&debug.BuildInfo{}, "(devel)"},
		{&debug.BuildInfo{Main: debug.Module{Path: "github.com/amqpretry/amqpretry/cmd/amqpretry", Version: "(devel)"}}, "(devel)"},
		{&debug.BuildInfo{Main: debug.Module{Path: "github.com/amqpretry/amqpretry/cmd/amqpretry", Version: "v0.3.1"}}, "v0.3.1"},
	} {
		if got := moduleVersion(tt.info); got != tt.want {
			t.Errorf("moduleVersion(%+v) = %q, want %q", tt.info, got, tt.want)
		}
	}
}

func TestTimeText(t *testing.T) {
	paris := time.FixedZone("CET", 3600)
	for _, tt := range []struct {
		in   time.Time
		want string
	}{
		{time.Time{}, "-"},
		{time.Date(2026, 1, 2, 4, 4, 5, 987654321, paris), "2026-01-02T03:04:05Z"},
		{time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "2026-01-02T03:04:05Z"},
	} {
		if got := timeText(tt.in); got != tt.want {
			t.Errorf("timeText(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// --json output is exact once decoded, and inert on a terminal: every
// character that does not print is a \u escape.
func TestJSONIsExactAndInert(t *testing.T) {
	hostile := "id\x1b[2J\u202e\u009b\x7f\u200b\U000e0041 Grüße 错误 \"q\" <b> \\ end"
	var b bytes.Buffer
	if err := writeJSON(&b, []deadLetterJSON{{MessageID: hostile, Exception: "line 1\nline 2\r"}}); err != nil {
		t.Fatal(err)
	}
	if i, what := terminalUnsafe(b.String(), true); i >= 0 {
		t.Errorf("JSON output has %s at byte %d:\n%q", what, i, b.String())
	}
	for _, w := range []string{`\u202e`, `\u009b`, `\u007f`, `\u200b`, `\udb40\udc41`, "Grüße 错误"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("JSON output lacks %s:\n%s", w, b.String())
		}
	}
	var back []deadLetterJSON
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("the output is not JSON: %v\n%s", err, b.String())
	}
	if len(back) != 1 || back[0].MessageID != hostile || back[0].Exception != "line 1\nline 2\r" {
		t.Errorf("decoded %+v, want the strings as they were", back)
	}
}

// The failed-at header is read as a time (RFC 3339 text, or an AMQP
// timestamp) and shown to the second; what is not a time is shown escaped.
func TestFailedAt(t *testing.T) {
	const prefix = "x-amqpretry-"
	at := time.Date(2026, 3, 4, 5, 6, 7, 891011121, time.UTC)
	for _, tt := range []struct {
		value any
		want  string
	}{
		{at.Format(time.RFC3339Nano), "2026-03-04T05:06:07Z"},
		{at, "2026-03-04T05:06:07Z"},
		{"yesterday\x1b[2J", `yesterday\x1b[2J`},
		{nil, "-"},
	} {
		d := &amqp.Delivery{Headers: amqp.Table{}}
		if tt.value != nil {
			d.Headers[prefix+"failed-at"] = tt.value
		}
		if got := failedAtText(d, prefix); got != tt.want {
			t.Errorf("failed-at %#v shows as %q, want %q", tt.value, got, tt.want)
		}
	}
}
