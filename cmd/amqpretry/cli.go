package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/outbox"
)

// command is one thing amqpretry does, `amqpretry NAME ARGUMENTS...`: one
// entry of commands, from which dispatch, help and usage errors all come.
type command struct {
	name    string // as typed: "dlq list", "version"
	summary string // one line, for amqpretry help
	// usage is the synopsis (one line, which a usage error repeats), a blank
	// line, and what the command does; --help adds the flags.
	usage string
	// run parses args (flags anywhere, with parse or parseAll) and does the
	// work. It returns errUsage for a mistake in the command line, and parse's
	// error for -h or --help.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// groups name the first words of two-word commands, with what help says of
// them.
var groups = []struct{ name, heading string }{
	{"dlq", "Dead-letter queues (the broker: --url, else $AMQP_URL, else " + amqpurl.Default + "):"},
	{"outbox", "Outbox tables (PostgreSQL: --dsn, else $DATABASE_URL):"},
}

// commands is filled in init: the help command's run reads it.
var commands []command

func init() {
	commands = []command{
		{"dlq list", "show the messages at the head of a dead-letter queue; they stay where they are", dlqListUsage, dlqList},
		{"dlq summary", "say what failed on a dead-letter queue: its causes, how many of each, since when", dlqSummaryUsage, dlqSummary},
		{"dlq show", "print one dead letter in full: properties, headers and body", dlqShowUsage, dlqShow},
		{"dlq replay", "send dead letters back to their queue (or another), each confirmed before it leaves", dlqReplayUsage, dlqReplay},
		{"dlq delete", "move dead letters to the queue's archive (QUEUE.archive), from where restore brings them back", dlqDeleteUsage, dlqDelete},
		{"dlq restore", "move archived dead letters back to the queue they were deleted from", dlqRestoreUsage, dlqRestore},
		{"dlq purge", "delete every ready message of a queue for good (no archive)", dlqPurgeUsage, dlqPurge},
		{"outbox list", "list an outbox table's rows, oldest first", outboxListUsage, outboxList},
		{"outbox show", "print one outbox row in full, with its whole last error", outboxShowUsage, outboxShow},
		{"outbox counts", "count an outbox table's rows by status", outboxCountsUsage, outboxCounts},
		{"outbox retry", "put failed outbox rows back in flight", outboxRetryUsage, outboxRetry},
		{"outbox schema", "print the DDL of the outbox and inbox tables", outboxSchemaUsage, outboxSchema},
		{"console", "serve a web page of dead letters grouped by cause, to look at and replay them", consoleUsage, runConsole},
		{"version", "print the version of amqpretry", "amqpretry version\n\nPrints the module version amqpretry was built from ((devel) for a build of a checkout).", runVersion},
		{"help", "list the commands, or show one command's usage and flags", "amqpretry help [COMMAND]\n\nWithout COMMAND, lists the commands; with one (amqpretry help dlq list), shows its usage and flags, as amqpretry COMMAND --help does.", runHelp},
	}
}

// errUsage marks a mistake in the command line: exit status 2, with the
// command's synopsis.
var errUsage = errors.New("usage")

// usagef is a usage error saying what is wrong.
func usagef(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// helpRequest is what parse returns for -h or --help: the command's usage,
// with the flags fs defines, goes to standard output, exit status 0.
type helpRequest struct{ fs *flag.FlagSet }

func (h *helpRequest) Error() string { return "help requested" }
func (h *helpRequest) Unwrap() error { return flag.ErrHelp }

// newFlags is a command's flag set: parse reports its errors.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, rest, code := lookup(args, stdout, stderr)
	if c == nil {
		return code
	}
	return finish(c, c.run(ctx, rest, stdout, stderr), stdout, stderr)
}

// lookup finds the command args name. When they name none (or a group, or
// ask for help) it says so itself, and returns the exit status.
func lookup(args []string, stdout, stderr io.Writer) (*command, []string, int) {
	if len(args) == 0 {
		writeOverview(stderr)
		return nil, nil, 2
	}
	if isHelpFlag(args[0]) {
		writeOverview(stdout)
		return nil, nil, 0
	}
	if c := find(args[0]); c != nil {
		return c, args[1:], 0
	}
	if !isGroup(args[0]) {
		fmt.Fprintf(stderr, "amqpretry: unknown command %q; amqpretry help lists the commands\n", args[0])
		return nil, nil, 2
	}
	group := args[0]
	switch {
	case len(args) == 1:
		fmt.Fprintf(stderr, "amqpretry %s: which command?\n", group)
	case isHelpFlag(args[1]):
		writeGroup(stdout, group)
		return nil, nil, 0
	case find(group+" "+args[1]) != nil:
		return find(group + " " + args[1]), args[2:], 0
	default:
		fmt.Fprintf(stderr, "amqpretry: unknown command %q\n", group+" "+args[1])
	}
	writeGroup(stderr, group)
	return nil, nil, 2
}

// finish turns what c returned into output and an exit status.
func finish(c *command, err error, stdout, stderr io.Writer) int {
	var help *helpRequest
	switch {
	case err == nil:
		return 0
	case errors.As(err, &help):
		writeHelp(stdout, c, help.fs)
		return 0
	}
	// A DSN, unlike an AMQP URL, reaches errors unredacted (a driver may
	// quote it): whatever the error says is redacted here, once for all.
	text := outbox.Redact(err.Error())
	if errors.Is(err, errUsage) {
		fmt.Fprintf(stderr, "amqpretry %s: %s\nusage: %s\n(amqpretry %s --help shows the flags)\n",
			c.name, strings.TrimPrefix(text, errUsage.Error()+": "), synopsis(c), c.name)
		return 2
	}
	fmt.Fprintf(stderr, "amqpretry %s: %s\n", c.name, text)
	return 1
}

func find(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

func isGroup(name string) bool {
	for _, g := range groups {
		if g.name == name {
			return true
		}
	}
	return false
}

func isHelpFlag(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

func synopsis(c *command) string {
	line, _, _ := strings.Cut(c.usage, "\n")
	return line
}

// writeOverview is amqpretry help: every command with its one line.
func writeOverview(w io.Writer) {
	fmt.Fprint(w, "amqpretry works the dead letters amqpretry's recoverer parks on RabbitMQ queues,\nand the rows of an outbox table.\n\nusage: amqpretry COMMAND [ARGUMENTS] [FLAGS]\n")
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s\n", g.heading)
		writeSummaries(w, g.name+" ")
	}
	fmt.Fprint(w, "\nOther commands:\n")
	writeSummaries(w, "")
	fmt.Fprint(w, "\namqpretry help COMMAND, or amqpretry COMMAND --help, shows a command's arguments and flags.\n"+
		"Exit status: 0 done; 1 the broker, a queue, the database or a row failed; 2 wrong usage.\n")
}

// writeGroup lists a group's commands.
func writeGroup(w io.Writer, group string) {
	for _, g := range groups {
		if g.name == group {
			fmt.Fprintf(w, "usage: amqpretry %s COMMAND [ARGUMENTS] [FLAGS]\n\n%s\n", group, g.heading)
		}
	}
	writeSummaries(w, group+" ")
	fmt.Fprintf(w, "\namqpretry %s COMMAND --help shows a command's arguments and flags.\n", group)
}

// writeSummaries lists the commands whose name starts with prefix, or, for
// "", those in no group.
func writeSummaries(w io.Writer, prefix string) {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	for _, c := range commands {
		first, _, grouped := strings.Cut(c.name, " ")
		if (prefix == "" && !(grouped && isGroup(first))) || (prefix != "" && strings.HasPrefix(c.name, prefix)) {
			fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
		}
	}
	tw.Flush()
}

// writeHelp is a command's --help: its usage, then the flags fs defines.
func writeHelp(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n", strings.TrimRight(c.usage, "\n"))
	if fs == nil {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	header := false
	fs.VisitAll(func(f *flag.Flag) {
		if !header {
			fmt.Fprint(tw, "\nflags:\n")
			header = true
		}
		name, usage := flag.UnquoteUsage(f)
		arg := "--" + f.Name
		if name != "" {
			arg += " " + name
		}
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" {
			usage += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\n", arg, usage)
	})
	tw.Flush()
}

func runHelp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("help")
	names, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	name := strings.Join(names, " ")
	switch {
	case name == "":
		writeOverview(stdout)
		return nil
	case isGroup(name):
		writeGroup(stdout, name)
		return nil
	}
	c := find(name)
	if c == nil {
		return usagef("no command %q; amqpretry help lists them", name)
	}
	// A command's flags are defined where it parses them: asked for help,
	// it parses only and returns them.
	var help *helpRequest
	if err := c.run(ctx, []string{"--help"}, io.Discard, io.Discard); !errors.As(err, &help) {
		return fmt.Errorf("%s --help did not return its usage: %v", name, err)
	}
	writeHelp(stdout, c, help.fs)
	return nil
}

func runVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlags("version")
	if positional, err := parseAll(fs, args); err != nil {
		return err
	} else if len(positional) > 0 {
		return usagef("version takes no arguments, got %q", positional)
	}
	info, _ := debug.ReadBuildInfo()
	fmt.Fprintf(stdout, "amqpretry %s (%s %s/%s)\n", moduleVersion(info), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}

// moduleVersion is the version of the module amqpretry was built from:
// v1.2.3 when installed with go install ...@v1.2.3, (devel) when built from
// a checkout (or when the binary carries no build information).
func moduleVersion(info *debug.BuildInfo) string {
	if info == nil || info.Main.Version == "" {
		return "(devel)"
	}
	return info.Main.Version
}

// timeText is a time for people: RFC 3339 in UTC to the second, "-" when
// unset.
func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// writeJSON writes v as indented JSON. Strings come out exact once decoded,
// and inert on a terminal: besides the control characters JSON escapes
// anyway, every character that does not print (DEL, C1 controls, bidi
// overrides, zero-width characters) is written as a \u escape. Text that is
// not UTF-8 decodes as U+FFFD, as encoding/json makes it.
func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(inertJSON(b), '\n'))
	return err
}

// inertJSON escapes what writeJSON promises in b, valid JSON: such a
// character can only be inside a string, where \u escapes mean the same.
func inertJSON(b []byte) []byte {
	var out bytes.Buffer
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r < utf8.RuneSelf && r != 0x7f || strconv.IsPrint(r) {
			out.Write(b[:n])
		} else if r > 0xffff {
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&out, `\u%04x\u%04x`, r1, r2)
		} else {
			fmt.Fprintf(&out, `\u%04x`, r)
		}
		b = b[n:]
	}
	return out.Bytes()
}
