// Command amqpretry works the dead letters amqpretry's recoverer parks on
// RabbitMQ queues, and the rows of an outbox table:
//
//	amqpretry dlq list    QUEUE [--limit N] [--match RE] [--error-type T] [--json]  the messages at the head of a DLQ, left in place
//	amqpretry dlq summary QUEUE [--recent DURATION] [--json]  what failed, how many of each cause, since when
//	amqpretry dlq show    QUEUE [--id ID | --key KEY] [--match RE] [--error-type T] one message in full, left in place
//	amqpretry dlq replay  QUEUE [--limit N] [--match RE] [--error-type T] [--dry-run] [--to QUEUE | --to-original-exchange]
//	amqpretry dlq delete  QUEUE [--id ID] [--match RE] [--error-type T]  move dead letters to QUEUE.archive
//	amqpretry dlq restore QUEUE [--id ID | --key KEY] [--match RE]  move archived ones back where they were deleted from
//	amqpretry dlq purge   QUEUE --yes                       delete every ready message for good
//
//	amqpretry outbox list   [--failed] [--limit N] [--json] the rows, oldest first
//	amqpretry outbox show   ID [--json]                     one row, its last error whole
//	amqpretry outbox counts [--json]                        rows per status
//	amqpretry outbox retry  ID | --all-failed               put failed rows back in flight
//	amqpretry outbox schema [--inbox-table NAME]            the DDL of the outbox and inbox tables
//
//	amqpretry console --queue DLQ [--queue DLQ...]          a web page: dead letters grouped by cause, replayed from it
//
//	amqpretry version | help [COMMAND] | COMMAND --help
//
// Install it with
//
//	go install github.com/amqpretry/amqpretry/cmd/amqpretry@latest
//
// or run it from a checkout with go run ./cmd/amqpretry.
//
// The broker is --url, else $AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/;
// for a cluster, the nodes' URLs separated by commas (tried in a random order).
// --header-prefix matches a recoverer configured with WithHeaderPrefix.
// list and show take messages without acking them and hand them back with
// basic.nack, waiting until the queue has them again before they close their
// channel (closed at once, a quorum queue counts them as returned by a look
// cut off): on a quorum queue with a delivery limit RabbitMQ 3.10 and 4.0
// count each look as a delivery (4.3 counts none, but counts a look cut off
// by a killed command or a lost connection, as every version does), and 4.x
// gives quorum queues a limit of 20 unless set otherwise, past which a DLQ
// drops the message. dlx.Topology declares its quorum DLQ with a
// limit of math.MaxInt32 for that reason (see dlx.Topology.DLQArguments); a
// quorum DLQ declared without one should not be listed 20 times on 4.0.
// What list and show print of a message is escaped in Go's notation: control
// characters, bidi overrides and bytes that are not UTF-8 show as \x1b,
// \u202e, \xff, never reaching the terminal. Table cells and one-line fields
// escape line breaks too; show keeps those of the body and of string headers
// (stack traces), indenting a header's further lines, and shows a binary body
// as a hex dump of its first 1024 bytes. --json output is exact once decoded,
// with every character that does not print written as a \u escape.
//
// The outbox commands reach PostgreSQL through --dsn, else $DATABASE_URL
// (postgres://user:password@host:5432/db or host=... keyword/value form), and
// work on --table (default amqpretry_outbox); schema only prints and needs
// no database. A password in a DSN is never printed: every error goes
// through outbox.Redact. A row's exchange, routing key, message id and last
// error are escaped as a dead letter's fields are.
//
// Times are RFC 3339 in UTC, to the second, and "-" when unset.
// Exit status: 0 done, 1 the broker, the queue, the database or the row
// failed, 2 wrong usage.
//
// The command is a module of its own, so that its PostgreSQL driver stays out
// of the library's go.mod.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/audit"
	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/console"
	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/deadletter"
	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/internal/framecheck"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const dlqListUsage = `amqpretry dlq list QUEUE [--limit N] [--match REGEXP] [--error-type TYPE] [--json] [--url URL] [--header-prefix PREFIX]

Shows the first --limit messages of QUEUE (with --match or --error-type,
the first --limit they select, looking at the whole queue; one that selects
nothing is an error), oldest failure first, a table of their message id
(for one without an id, its key: fp: and a fingerprint of its body,
properties and headers),
original routing key, exception, attempts (the handler's calls in the
delivery that failed for good), broker retries (the trips through the
broker's retry tiers or delayed redelivery before that, x-retry-count) and
failure time. A look takes messages from the head of the queue, and a
quorum queue puts those handed back behind the rest, so which messages a
--limit smaller than the queue takes changes from one look to the next;
their order on the page, and their keys (show --id, show --key), do not.
It takes them without acking, hands each back with basic.nack(requeue)
and waits until the queue has them again before it closes its channel.
--match (a regular expression over the message id, original routing key,
exception, each header as "name: value" and the body's first 4 KiB, in any
case unless --case-sensitive) and --error-type (the recoverer's error-type
header, in any case) select as replay's do.

A dead letter RabbitMQ made itself (a consumer's reject, an expiry, a
limit) has no fault headers: its original routing key, exchange and queue,
its failure time, attempts (the latest death's count) and exception (the
reason) come from its x-death header.

--json prints a JSON array instead, one object per message, with the fields
  index (the place in this list), key (what show --key takes: id: and the
  message id, or fp: and a fingerprint), message_id, routing_key (the original one), original_exchange,
  original_queue, exception (whole), error_type, attempts (null when unknown),
  retries (broker retries), failed_at and timestamp (RFC 3339, null when unset), content_type,
  body_bytes, and unreadable_headers, present only for a message whose
  headers amqp091-go cannot parse (nested deeper than 32 levels, over 8,192
  entries), saying why: the other header fields are then empty, and the
  message stays on the queue intact.`

const dlqShowUsage = `amqpretry dlq show QUEUE [--id MESSAGE_ID | --key KEY] [--match REGEXP] [--error-type TYPE] [--url URL] [--header-prefix PREFIX]

Prints one message of QUEUE in full: its properties, every header and the
body (a binary body as a hex dump of its first 1024 bytes). --id picks the
first message with that message id, --key the first with that key as list
shows it (id:MESSAGE_ID, or fp: and a fingerprint for a message without an
id); --match and --error-type (as for list) the first they select; without
any, the message at the head of the queue now. One that selects nothing is
an error. The messages looked at are handed back. (--index is gone: a
quorum queue reorders at each look, so a position named another message
each time.)`

const dlqReplayUsage = `amqpretry dlq replay QUEUE [--limit N] [--id ID] [--match REGEXP] [--error-type TYPE] [--dry-run] [--to QUEUE | --to-original-exchange] [--url URL] [--header-prefix PREFIX]

Sends the messages of QUEUE back: by default to the queue they failed on
(the recoverer's original-queue header), with --to to another queue, with
--to-original-exchange to the exchange and routing key first used. Each is
published with a confirm before it is acked off QUEUE, without its fault
headers but with its history (x-amqpretry-replayed, and the exception,
error type and time it last failed with), so that one that fails again
shows it was replayed; one without a destination, or not selected, stays.
--match is a regular expression over
the message id, original routing key, exception, each header (as
"name: value") and the body's first 4 KiB, in any case unless
--case-sensitive; --error-type takes the messages whose error type (the
recoverer's error-type header) is TYPE, in any case. --id takes only the
message(s) whose message id is exactly ID (producers that use a business key
as the id may have several: add --limit 1 for the oldest). --limit N
replays the N selected messages that failed first, found by a look at the
whole queue before the replay (a quorum queue's head is whatever the last
look left there). A selection that selects nothing is an error. --dry-run prints what would be replayed and
where to, and moves nothing (a look, as list's).

Each replay appends one JSON line to the audit log, the console's: who
(the OS user), the host, the queue, the destination, the keys of the
messages asked for (id:MESSAGE_ID, or fp: and a fingerprint), how many
were replayed and left, and the outcome. It goes to --audit FILE, by default
$XDG_STATE_HOME/amqpretry/audit.log (else ~/.local/state/amqpretry/audit.log),
- for standard error; --no-audit writes none. A log that cannot be opened
stops the replay before it begins.`

const dlqPurgeUsage = `amqpretry dlq purge QUEUE --yes [--audit FILE | --no-audit] [--url URL]

Deletes every ready message of QUEUE for good, with nothing kept in an
archive (amqpretry dlq delete archives instead; purge QUEUE.archive to
empty an archive); messages a consumer holds unacked stay with it. It
appends an audit line as replay does.`

// brokerFlags are the flags of the commands that reach the broker.
type brokerFlags struct{ url, prefix *string }

func addBrokerFlags(fs *flag.FlagSet, withPrefix bool) brokerFlags {
	b := brokerFlags{url: fs.String("url", "", "the broker's `URL`; several, separated by commas, for the nodes of a cluster (default $AMQP_URL, else "+amqpurl.Default+")")}
	if withPrefix {
		b.prefix = fs.String("header-prefix", recoverer.DefaultHeaderPrefix, "the `PREFIX` of the recoverer's fault headers (recoverer.WithHeaderPrefix)")
	}
	return b
}

// urls are the broker addresses --url, $AMQP_URL or the default give.
func (b brokerFlags) urls() ([]string, error) {
	url := *b.url
	if url == "" {
		url = os.Getenv("AMQP_URL")
	}
	if url == "" {
		url = amqpurl.Default
	}
	urls := amqpurl.SplitList(url)
	if len(urls) == 0 || slices.Contains(urls, "") {
		return nil, usagef("--url: an empty address in the list %q", amqpurl.Redact(url))
	}
	for _, u := range urls {
		if _, err := amqpurl.Parse(u); err != nil {
			return nil, usagef("--url: %v", err)
		}
	}
	return urls, nil
}

func dlqList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dlq list")
	broker := addBrokerFlags(fs, true)
	limit := fs.Int("limit", 100, "show at most `N` messages, from the head of the queue")
	asJSON := fs.Bool("json", false, "print a JSON array, one object per message, instead of a table")
	selFlags := addSelectionFlags(fs)
	queue, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *limit < 1 {
		return usagef("--limit expects 1 or more, got %d", *limit)
	}
	sel, err := selFlags.selection(*broker.prefix)
	if err != nil {
		return err
	}
	urls, err := broker.urls()
	if err != nil {
		return err
	}
	return withChannel(urls, func(ch *amqp.Channel) error {
		return list(ctx, ch, queue, *limit, sel, *asJSON, stdout, stderr)
	})
}

func dlqShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dlq show")
	broker := addBrokerFlags(fs, true)
	index := fs.String("index", "", "gone: use --id or --key, as dlq list shows them")
	id := fs.String("id", "", "the first message with this message `ID`")
	key := fs.String("key", "", "the first message with this `KEY`, as dlq list shows it (id:ID, or fp:FINGERPRINT)")
	selFlags := addSelectionFlags(fs)
	queue, err := parse(fs, args)
	if err != nil {
		return err
	}
	sel, err := selFlags.selection(*broker.prefix)
	if err != nil {
		return err
	}
	sel.id, sel.idSet = *id, *id != ""
	sel.key = *key
	if isSet(fs, "index") {
		return usagef("--index %s: --index is gone, since a quorum DLQ reorders its messages at each look and a position named another message each time; use --id MESSAGE_ID or --key KEY, as amqpretry dlq list %s shows them", *index, queue)
	}
	if isSet(fs, "key") && isSet(fs, "id") {
		return usagef("show takes --id or --key, not both")
	}
	urls, err := broker.urls()
	if err != nil {
		return err
	}
	return withChannel(urls, func(ch *amqp.Channel) error { return show(ctx, ch, queue, sel, stdout, stderr) })
}

func dlqReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dlq replay")
	broker := addBrokerFlags(fs, true)
	limit := fs.Int("limit", 0, "replay the `N` oldest failures (0: every one)")
	selFlags := addSelectionFlags(fs)
	dryRun := fs.Bool("dry-run", false, "print what would be replayed, and where to, and move nothing")
	auditFlags := addAuditFlags(fs)
	id := fs.String("id", "", "only the message(s) with exactly this message `ID` (add --limit 1 for the oldest)")
	to := fs.String("to", "", "send to this `QUEUE`")
	toOriginal := fs.Bool("to-original-exchange", false, "send to the exchange and routing key first used")
	queue, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *limit < 0 {
		return usagef("--limit expects 1 or more (or 0, the default: every message), got %d", *limit)
	}
	if *to != "" && *toOriginal {
		return usagef("replay takes --to or --to-original-exchange, not both")
	}
	sel, err := selFlags.selection(*broker.prefix)
	if err != nil {
		return err
	}
	urls, err := broker.urls()
	if err != nil {
		return err
	}
	if isSet(fs, "id") && *id == "" {
		return usagef("--id expects a message id")
	}
	sel.id, sel.idSet = *id, isSet(fs, "id")
	rs := replaySelection{selection: sel, limit: *limit}
	if *dryRun {
		return withChannel(urls, func(ch *amqp.Channel) error {
			return dryRunReplay(ctx, ch, queue, rs, *to, *toOriginal, stdout, stderr)
		})
	}
	log, err := auditFlags.open(stderr)
	if err != nil {
		return err
	}
	defer log.Close()
	return replay(ctx, urls, queue, rs, *to, *toOriginal, *broker.prefix, log, stdout, stderr)
}

// replaySelection is which dead letters replay moves: of those the
// selection selects, the limit oldest failures (0: every one).
type replaySelection struct {
	selection
	limit int
}

// auditFlags say where a dlq action's audit line goes.
type auditFlags struct {
	path *string
	off  *bool
}

func addAuditFlags(fs *flag.FlagSet) auditFlags {
	return auditFlags{
		path: fs.String("audit", audit.DefaultPath(), "append an audit line (who, what, which messages, outcome) to `FILE`; - for standard error"),
		off:  fs.Bool("no-audit", false, "write no audit line"),
	}
}

// open opens the audit log before the action, so that a log that cannot
// be written stops it; nil with --no-audit.
func (f auditFlags) open(stderr io.Writer) (*audit.Log, error) {
	if *f.off {
		return nil, nil
	}
	return audit.Open(*f.path, stderr)
}

func dlqPurge(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dlq purge")
	broker := addBrokerFlags(fs, false)
	yes := fs.Bool("yes", false, "really delete the messages")
	auditFlags := addAuditFlags(fs)
	queue, err := parse(fs, args)
	if err != nil {
		return err
	}
	if !*yes {
		return usagef("purge deletes every ready message on %s; add --yes to do it", queue)
	}
	urls, err := broker.urls()
	if err != nil {
		return err
	}
	log, err := auditFlags.open(stderr)
	if err != nil {
		return err
	}
	defer log.Close()
	return withChannel(urls, func(ch *amqp.Channel) error {
		entry := console.AuditEntry{Action: "purge", Queue: queue, Left: -1, Depth: -1}
		if q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err == nil {
			entry.Requested = q.Messages
		}
		n, err := ch.QueuePurge(queue, false)
		if err != nil {
			err = fmt.Errorf("purge %s: %w", queue, err)
			entry.Outcome, entry.Summary, entry.Error = "failed", "purge failed", err.Error()
			return errors.Join(err, log.Record(entry))
		}
		entry.Done, entry.Depth, entry.Left = n, 0, 0
		entry.Outcome, entry.Summary = "ok", fmt.Sprintf("purged %d ready messages", n)
		fmt.Fprintf(stdout, "purged %d ready messages from %s (unacked ones stay with their consumers)\n", n, queue)
		return log.Record(entry)
	})
}

// isSet says whether the command line set the flag.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// parse accepts flags before and after the one positional QUEUE. For -h
// or --help it returns a *helpRequest.
func parse(fs *flag.FlagSet, args []string) (string, error) {
	positional, err := parseAll(fs, args)
	if err != nil {
		return "", err
	}
	switch len(positional) {
	case 1:
		return positional[0], nil
	case 0:
		return "", usagef("which QUEUE?")
	}
	return "", usagef("expected one QUEUE, got %d arguments: %q", len(positional), positional)
}

func withChannel(urls []string, f func(*amqp.Channel) error) error {
	// Guarded: a message whose headers amqp091-go cannot parse arrives
	// marked instead of closing the connection, and the tools carry on past
	// it (see docs/limitations.md).
	conn, err := amqpconn.Dial(context.Background(), amqpconn.Config{URLs: urls, DialTimeout: 10 * time.Second, Guard: framecheck.Guard})
	if err != nil {
		return fmt.Errorf("connect to %w", err) // err names the address
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return f(ch)
}

// Looking at a DLQ and reading its fault headers is shared with the console
// (package deadletter): look takes a snapshot with a consumer and hands
// every message back with one basic.nack(multiple, requeue), waiting until the queue has them again before
// the channel may close, header reads a header as raw text
// (for matching; print it with shownHeader), originalKey is the routing key
// a dead letter was first published with.
var (
	look        = deadletter.Look
	header      = deadletter.Header
	originalKey = deadletter.OriginalKey
)

func list(ctx context.Context, ch *amqp.Channel, queue string, limit int, sel selection, asJSON bool, stdout, stderr io.Writer) error {
	prefix := sel.prefix
	msgs, seen, err := lookSelected(ctx, ch, queue, limit, sel)
	if err != nil && msgs == nil {
		return err
	}
	warnIf(stderr, err)
	if len(msgs) == 0 && sel.filters() {
		return sel.noneSelected(queue, seen)
	}
	sortByFailure(msgs, prefix)
	if asJSON {
		out := make([]deadLetterJSON, 0, len(msgs))
		for i := range msgs {
			out = append(out, deadLetterOf(i, &msgs[i], prefix))
		}
		return writeJSON(stdout, out)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "MESSAGE ID\tROUTING KEY\tEXCEPTION\tATTEMPTS\tBROKER RETRIES\tFAILED AT")
	for _, d := range msgs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", idOrKey(&d), orDash(escapeLine(originalKey(&d))),
			oneLine(exceptionText(&d), 60),
			orDash(shownHeader(&d, prefix+recoverer.SuffixAttempts)), dlx.RetryCount(&d),
			failedAtText(&d, prefix))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d message(s) shown from %s", len(msgs), queue)
	if sel.filters() {
		fmt.Fprintf(stdout, " (selected of %d looked at)", seen)
	}
	if len(msgs) > 0 {
		fmt.Fprintf(stdout, "; amqpretry dlq show %s --id ID (--key fp:… for one without an id) prints one in full", queue)
	}
	fmt.Fprintln(stdout)
	return nil
}

// deadLetterJSON is one message of dlq list --json; dlqListUsage documents
// the fields, whose names do not change.
type deadLetterJSON struct {
	Index            int       `json:"index"`
	Key              string    `json:"key"`
	MessageID        string    `json:"message_id"`
	RoutingKey       string    `json:"routing_key"`
	OriginalExchange string    `json:"original_exchange"`
	OriginalQueue    string    `json:"original_queue"`
	Exception        string    `json:"exception"`
	ErrorType        string    `json:"error_type"`
	Attempts         *int64    `json:"attempts"`
	Retries          int       `json:"retries"`
	FailedAt         *jsonTime `json:"failed_at"`
	Timestamp        *jsonTime `json:"timestamp"`
	ContentType      string    `json:"content_type"`
	BodyBytes        int       `json:"body_bytes"`
	// UnreadableHeaders says why amqp091-go cannot read the message's
	// headers, which the other fields then lack; absent when it can.
	UnreadableHeaders string `json:"unreadable_headers,omitempty"`
}

// exceptionText is the exception for a table cell, or, for a message whose
// headers amqp091-go cannot read, that.
func exceptionText(d *amqp.Delivery) string {
	if why := header(d, amqphdr.UnreadableHeaders); why != "" {
		return "(headers unreadable: " + why + ")"
	}
	return deadletter.Exception(d)
}

func deadLetterOf(i int, d *amqp.Delivery, prefix string) deadLetterJSON {
	m := deadLetterJSON{
		Index: i, Key: console.Key(d), MessageID: d.MessageId, RoutingKey: originalKey(d),
		OriginalExchange: deadletter.OriginalExchange(d), OriginalQueue: deadletter.OriginalQueue(d, prefix),
		Exception: deadletter.Exception(d), ErrorType: header(d, prefix+recoverer.SuffixErrorType),
		Retries: dlx.RetryCount(d), ContentType: d.ContentType, BodyBytes: len(d.Body),
		UnreadableHeaders: header(d, amqphdr.UnreadableHeaders),
	}
	if n, ok := attempts(d, prefix); ok {
		m.Attempts = &n
	}
	if t, ok := failedAt(d, prefix); ok {
		m.FailedAt = (*jsonTime)(&t)
	}
	if !d.Timestamp.IsZero() {
		t := d.Timestamp.UTC()
		m.Timestamp = (*jsonTime)(&t)
	}
	return m
}

// jsonTime is a time in --json: RFC 3339, and for a year past 9999, which
// encoding/json refuses (a producer that wrote milliseconds where AMQP
// means seconds, as Node's Date.now() does), the same layout with the year
// as it is, rather than failing the whole list.
type jsonTime time.Time

func (t jsonTime) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Time(t).Format(time.RFC3339Nano))
}

// attempts reads the recoverer's attempts header, a number (or its text),
// else, for a dead letter RabbitMQ made, the count of its latest death.
func attempts(d *amqp.Delivery, prefix string) (int64, bool) {
	if _, ok := d.Headers[prefix+recoverer.SuffixAttempts]; !ok {
		if death, ok := deadletter.LatestDeath(d); ok && death.Count > 0 {
			return int64(death.Count), true
		}
	}
	switch v := d.Headers[prefix+recoverer.SuffixAttempts].(type) {
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case int:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// failedAt reads the recoverer's failed-at header: RFC 3339 text (or an
// AMQP timestamp, as another tool may write it); else, for a dead letter
// RabbitMQ made, the time of its latest death.
func failedAt(d *amqp.Delivery, prefix string) (time.Time, bool) {
	if _, ok := d.Headers[prefix+recoverer.SuffixFailedAt]; !ok {
		if death, ok := deadletter.LatestDeath(d); ok && !death.Time.IsZero() {
			return death.Time.UTC(), true
		}
	}
	switch v := d.Headers[prefix+recoverer.SuffixFailedAt].(type) {
	case time.Time:
		return v.UTC(), !v.IsZero()
	case string:
		t, err := time.Parse(time.RFC3339Nano, v)
		return t.UTC(), err == nil
	}
	return time.Time{}, false
}

// failedAtText is the failed-at header for a table cell: to the second, or,
// when it is not a time, what it holds, escaped.
func failedAtText(d *amqp.Delivery, prefix string) string {
	if t, ok := failedAt(d, prefix); ok {
		return timeText(t)
	}
	return orDash(shownHeader(d, prefix+recoverer.SuffixFailedAt))
}

func show(ctx context.Context, ch *amqp.Channel, queue string, sel selection, stdout, stderr io.Writer) error {
	var d *amqp.Delivery
	seen := 0
	msgs, err := look(ctx, ch, queue, 0, func(m amqp.Delivery) bool {
		seen++
		if sel.selects(&m) {
			d = &m
			return true
		}
		return false
	})
	if err != nil && msgs == nil {
		return err
	}
	warnIf(stderr, err)
	if d == nil {
		if sel.filters() {
			return sel.noneSelected(queue, seen)
		}
		return fmt.Errorf("%s is empty", queue)
	}
	writeMessage(stdout, d, sel.prefix)
	return nil
}

// sortByFailure orders msgs oldest failure first (those without a failure
// time last), then by key: an order that does not depend on the queue's,
// which a quorum queue changes at each look.
func sortByFailure(msgs []amqp.Delivery, prefix string) {
	type entry struct {
		at  time.Time
		key string
		d   amqp.Delivery
	}
	entries := make([]entry, len(msgs))
	for i := range msgs {
		t, _ := failedAt(&msgs[i], prefix)
		entries[i] = entry{t, console.Key(&msgs[i]), msgs[i]}
	}
	slices.SortStableFunc(entries, func(a, b entry) int {
		if a.at.IsZero() != b.at.IsZero() {
			if a.at.IsZero() {
				return 1
			}
			return -1
		}
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	for i, e := range entries {
		msgs[i] = e.d
	}
}

// idOrKey names a message in list's table: its id, or for one without, its
// key (fp: and a fingerprint), which show --key takes.
func idOrKey(d *amqp.Delivery) string {
	if d.MessageId != "" {
		return escapeLine(d.MessageId)
	}
	return console.Key(d)
}

// lookSelected looks at queue for the first limit messages sel selects,
// taking as many as it must (every message, when sel filters), and returns
// those with how many it looked at.
func lookSelected(ctx context.Context, ch *amqp.Channel, queue string, limit int, sel selection) (selected []amqp.Delivery, seen int, err error) {
	if !sel.filters() {
		msgs, err := look(ctx, ch, queue, limit, nil)
		return msgs, len(msgs), err
	}
	msgs, err := look(ctx, ch, queue, 0, func(m amqp.Delivery) bool {
		if sel.selects(&m) {
			selected = append(selected, m)
		}
		return len(selected) == limit
	})
	if err != nil && msgs == nil {
		return nil, 0, err
	}
	if selected == nil {
		selected = []amqp.Delivery{}
	}
	return selected, len(msgs), err
}

// dryRunReplay prints what replay would move, and where to, and moves
// nothing: a look, which chooses as replay does (the selection, a
// destination, the oldest --limit failures).
func dryRunReplay(ctx context.Context, ch *amqp.Channel, queue string, sel replaySelection, to string, toOriginal bool, stdout, stderr io.Writer) error {
	msgs, err := look(ctx, ch, queue, 0, nil)
	if err != nil && msgs == nil {
		return err
	}
	warnIf(stderr, err)
	moving, staying, selected := sel.choose(msgs, func(d *amqp.Delivery) string { return replayDestination(d, to, toOriginal, sel.prefix) })
	if selected == 0 && sel.filters() {
		return sel.noneSelected(queue, len(msgs))
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "MESSAGE ID\tEXCEPTION\tFAILED AT\tWOULD GO TO")
	for i := range moving {
		d := &moving[i]
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", idOrKey(d), oneLine(exceptionText(d), 60),
			failedAtText(d, sel.prefix), escapeLine(replayDestination(d, to, toOriginal, sel.prefix)))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "dry run: would replay %d message(s) from %s, of %d looked at; nothing was moved", len(moving), queue, len(msgs))
	if staying > 0 {
		fmt.Fprintf(stdout, " (%d selected without a destination would stay)", staying)
	}
	fmt.Fprintln(stdout)
	return nil
}

// choose is what replay moves of msgs, a look at the whole queue: those
// selected with a destination, oldest failure first, at most limit; with
// how many selected have no destination, and how many were selected.
func (sel replaySelection) choose(msgs []amqp.Delivery, to func(*amqp.Delivery) string) (moving []amqp.Delivery, staying, selected int) {
	for _, d := range msgs {
		if !sel.selects(&d) {
			continue
		}
		selected++
		if to(&d) == "" {
			staying++
			continue
		}
		moving = append(moving, d)
	}
	sortByFailure(moving, sel.prefix)
	if sel.limit > 0 && len(moving) > sel.limit {
		moving = moving[:sel.limit]
	}
	return moving, staying, selected
}

// replayDestination is where replay would send d, as dlx.Replay chooses:
// "" when it has nowhere to go.
func replayDestination(d *amqp.Delivery, to string, toOriginal bool, prefix string) string {
	switch {
	case to != "":
		return "queue " + to
	case toOriginal:
		exchange, key, _ := amqphdr.FirstPublished(d.Headers)
		if exchange == "" && key == "" {
			return ""
		}
		if exchange == "" {
			exchange = "(default)"
		}
		return "exchange " + exchange + ", key " + key
	}
	q, _ := d.Headers[prefix+recoverer.SuffixOriginalQueue].(string)
	if q == "" {
		q, _ = d.Headers[amqphdr.XFirstDeathQueue].(string)
	}
	if q == "" {
		return ""
	}
	return "queue " + q
}

// writeMessage is show's output: every property, header and the body, each
// escaped (render.go).
func writeMessage(w io.Writer, d *amqp.Delivery, prefix string) {
	fmt.Fprintf(w, "message id:     %s\nrouting key:    %s\nexchange:       %s\ncontent type:   %s\ntimestamp:      %s\nfailed at:      %s\nretries:        %d\nheaders:\n",
		escapeLine(d.MessageId), escapeLine(d.RoutingKey), escapeLine(d.Exchange), escapeLine(d.ContentType), timeText(d.Timestamp),
		failedAtText(d, prefix), dlx.RetryCount(d))
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		writeHeader(w, k, d.Headers[k])
	}
	writeBody(w, d.ContentType, d.Body)
}

func replay(ctx context.Context, urls []string, queue string, sel replaySelection, to string, toOriginal bool, prefix string, log *audit.Log, stdout, stderr io.Writer) error {
	// The copy keeps its history (how often it was replayed, what it failed
	// with), as the console's replays do.
	m := movement{action: "replay", done: "replayed", destination: "the queue each failed on",
		opts: []dlx.ReplayOption{dlx.ReplayKeepHistory()},
		to:   func(d *amqp.Delivery) string { return replayDestination(d, to, toOriginal, prefix) }}
	switch {
	case to != "":
		m.opts = append(m.opts, dlx.ReplayTo(to))
		m.destination = "queue " + to
	case toOriginal:
		m.opts = append(m.opts, dlx.ReplayToOriginalExchange())
		m.destination = "the original exchange and routing key"
	}
	return move(ctx, urls, queue, sel, m, prefix, log, stdout, stderr)
}

// movement is what move does with the messages it takes: replay them,
// archive them (dlq delete) or restore them from an archive.
type movement struct {
	action, done string // for the audit line and the output: "replay", "replayed"
	destination  string // for the audit line
	opts         []dlx.ReplayOption
	to           func(*amqp.Delivery) string // where a message goes, as dlx.Replay will choose; "" nowhere
}

// move moves the messages of queue that sel selects through dlx.Replay,
// each confirmed before it is acked, and writes the audit line.
func move(ctx context.Context, urls []string, queue string, sel replaySelection, m movement, prefix string, log *audit.Log, stdout, stderr io.Writer) error {
	// The publisher's own story (connected, reconnecting) is not the
	// operator's: only its warnings and errors show.
	quiet := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pub, err := publisher.New(urls[0], publisher.WithURLs(urls...), publisher.WithLogger(quiet))
	if err != nil {
		return err
	}
	defer pub.Close()
	opts := append([]dlx.ReplayOption{dlx.ReplayLimit(sel.limit), dlx.ReplayHeaderPrefix(prefix)}, m.opts...)
	// With a limit, the oldest failures go: a look finds their keys, since
	// a quorum queue's head is whatever the last look left there.
	var quota map[string]int
	if sel.limit > 0 {
		err := withChannel(urls, func(ch *amqp.Channel) error {
			msgs, err := look(ctx, ch, queue, 0, nil)
			if err != nil && msgs == nil {
				return err
			}
			warnIf(stderr, err)
			moving, _, _ := sel.choose(msgs, m.to)
			quota = make(map[string]int, len(moving))
			for i := range moving {
				quota[console.Key(&moving[i])]++
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	// The match sees every message dlx.Replay considers: those selected
	// with a destination are the ones it goes on to publish, the keys the
	// audit line lists.
	selected := 0
	var keys []string
	opts = append(opts, dlx.ReplayMatch(func(d *amqp.Delivery) bool {
		if !sel.selects(d) {
			return false
		}
		selected++
		if quota != nil {
			k := console.Key(d)
			if quota[k] == 0 {
				return false
			}
			quota[k]--
		}
		if m.to(d) != "" {
			keys = append(keys, console.Key(d))
		}
		return true
	}))
	entry := console.AuditEntry{Action: m.action, Queue: queue, Destination: m.destination}
	last := time.Now()
	opts = append(opts, dlx.ReplayProgress(func(s dlx.ReplayStats) {
		if time.Since(last) >= time.Second {
			last = time.Now()
			fmt.Fprintf(stderr, "… %d %s, %d skipped, %d looked at\n", s.Replayed, m.done, s.Skipped, s.Scanned)
		}
	}))
	// A queue that is not there is an error, before anything is said of
	// what was replayed.
	var res deadletter.Result
	err = withChannel(urls, func(ch *amqp.Channel) error {
		res, err = deadletter.Replay(ctx, ch, pub, queue, opts...)
		return err
	})
	entry.Messages, entry.Requested, entry.Done, entry.Depth = keys, len(keys), res.Replayed, res.Left
	entry.Left = len(keys) - res.Replayed
	entry.Outcome, entry.Summary = "ok", fmt.Sprintf("%s %d, %d left", m.done, res.Replayed, entry.Left)
	if err != nil {
		entry.Outcome, entry.Error = "failed", err.Error()
	}
	if res.Scanned == 0 && err != nil {
		return errors.Join(err, log.Record(entry))
	}
	fmt.Fprintf(stdout, "%s %d message(s) from %s", m.done, res.Replayed, queue)
	if n := res.Skipped - res.Unreadable; n > 0 {
		fmt.Fprintf(stdout, "; %d looked at and left there (not matching or without a destination)", n)
	}
	if res.Unreadable > 0 {
		fmt.Fprintf(stdout, "; %d with headers amqp091-go cannot read left there (see docs/limitations.md)", res.Unreadable)
	}
	if left := res.Left; left >= 0 {
		fmt.Fprintf(stdout, "; %d message(s) on it now", left)
		if left > 0 {
			fmt.Fprintf(stdout, " (amqpretry dlq list %s shows them)", queue)
		}
	}
	fmt.Fprintln(stdout)
	if err == nil && sel.filters() && selected == 0 {
		err = sel.noneSelected(queue, res.Scanned)
		entry.Outcome, entry.Error = "failed", err.Error()
	}
	return errors.Join(err, log.Record(entry))
}

// warnIf says on stderr what went wrong after a look had what it shows:
// the output stands, the warning says what it cost.
func warnIf(stderr io.Writer, err error) {
	if err != nil {
		fmt.Fprintf(stderr, "amqpretry: warning: %v\n", err)
	}
}

// shownHeader is a header's value, escaped for one line.
func shownHeader(d *amqp.Delivery, key string) string {
	if v, ok := d.Headers[key]; ok && v != nil {
		return headerValue(v)
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine is s for a table cell: its whitespace runs made one space, cut to
// n characters, escaped. It cuts before escaping, counting a byte that is not
// UTF-8 as one character, so that the cut neither splits an escape nor turns
// such a byte into U+FFFD.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > n {
		end := 0
		for range n - 1 {
			_, size := utf8.DecodeRuneInString(s[end:])
			end += size
		}
		return escapeLine(s[:end]) + "…"
	}
	return orDash(escapeLine(s))
}
