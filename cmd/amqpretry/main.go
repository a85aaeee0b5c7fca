// Command amqpretry inspects and repairs dead-letter queues and outbox
// tables.
//
//	amqpretry dlq list    QUEUE [--limit N]                 a table of the first N messages (100), left in place
//	amqpretry dlq show    QUEUE [--index N | --id ID]       one message in full, left in place
//	amqpretry dlq replay  QUEUE [--limit N] [--match RE] [--to QUEUE | --to-original-exchange]
//	amqpretry dlq purge   QUEUE --yes                       delete every message
//
//	amqpretry outbox list   [--failed] [--limit N]          the outbox's rows, oldest first (100)
//	amqpretry outbox retry  ID | --all-failed               put failed rows back in flight
//	amqpretry outbox schema [--inbox-table NAME]            the DDL of the outbox and inbox tables
//
// The outbox commands reach PostgreSQL through --dsn, else $DATABASE_URL
// (postgres://user:password@host:5432/db or host=... keyword/value form), and
// work on --table (default amqpretry_outbox); schema only prints and needs
// no database. A password in a DSN is never printed: every error goes
// through outbox.Redact. A row's exchange, routing key, message id and last
// error are escaped as a dead letter's fields are.
//
// The broker is --url, else $AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/;
// for a cluster, the nodes' URLs separated by commas (tried in a random order).
// --header-prefix matches a recoverer configured with WithHeaderPrefix.
// list and show take messages without acking them and hand them back, in
// place, with basic.nack when they end: on a quorum queue with a delivery
// limit RabbitMQ 4.0 counts each look as a delivery (4.3 no longer counts a
// nack, but counts a look cut off by a killed command or a lost connection,
// as every version does), and 4.x gives quorum queues a limit of 20 unless set otherwise, past
// which a DLQ drops the message. dlx.Topology declares its quorum DLQ with a
// limit of math.MaxInt32 for that reason (see dlx.Topology.DLQArguments); a
// quorum DLQ declared without one should not be listed 20 times on 4.0.
// What list and show print of a message is escaped in Go's notation: control
// characters, bidi overrides and bytes that are not UTF-8 show as \x1b,
// \u202e, \xff, never reaching the terminal. Table cells and one-line fields
// escape line breaks too; show keeps those of the body and of string headers
// (stack traces), indenting a header's further lines, and shows a binary body
// as a hex dump of its first 1024 bytes.
// Exit status: 0 done, 1 the broker, the queue, the database or the row
// failed, 2 wrong usage.
//
// The command is a module of its own, so that its PostgreSQL driver stays out
// of the library's go.mod; its go.mod points at the library and the outbox
// beside it in the checkout (replace directives, which go install of a
// version refuses): build it there, with cd cmd/amqpretry && go build.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

const usage = `usage:
  amqpretry dlq list    QUEUE [--limit N (100)]
  amqpretry dlq show    QUEUE [--index N | --id MESSAGE_ID]
  amqpretry dlq replay  QUEUE [--limit N] [--match REGEXP] [--to QUEUE | --to-original-exchange]
  amqpretry dlq purge   QUEUE --yes
flags for every dlq command: --url URL[,URL...] (default $AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/;
  several: the nodes of a cluster),
  --header-prefix PREFIX (default x-amqpretry-)

  amqpretry outbox list   [--failed] [--limit N (100)]
  amqpretry outbox retry  ID | --all-failed
  amqpretry outbox schema [--inbox-table NAME (amqpretry_inbox)]
flags for every outbox command: --dsn DSN (default $DATABASE_URL), --table NAME (default amqpretry_outbox)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks a mistake in the command line: exit status 2.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := dispatch(ctx, args, stdout, stderr)
	if err == nil {
		return 0
	}
	// A DSN, unlike an AMQP URL, reaches errors unredacted (a driver may
	// quote it): whatever the error says is redacted here, once for all.
	text := outbox.Redact(err.Error())
	if errors.Is(err, errUsage) {
		fmt.Fprintf(stderr, "amqpretry: %s\n%s", text, usage)
		return 2
	}
	fmt.Fprintf(stderr, "amqpretry: %s\n", text)
	return 1
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) >= 1 && args[0] == "outbox" {
		return dispatchOutbox(ctx, args[1:], stdout)
	}
	if len(args) < 2 || args[0] != "dlq" {
		return fmt.Errorf("%w: expected \"dlq list|show|replay|purge QUEUE\" or \"outbox list|retry|schema\"", errUsage)
	}
	cmd := args[1]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	url := fs.String("url", "", "broker URL")
	limit := fs.Int("limit", 0, "at most this many messages")
	index := fs.Int("index", 0, "show: the message at this position (0 is the head)")
	id := fs.String("id", "", "show: the message with this message id")
	match := fs.String("match", "", "replay: only messages whose id, routing key, error or body match this regular expression")
	to := fs.String("to", "", "replay: send to this queue")
	toOriginal := fs.Bool("to-original-exchange", false, "replay: send to the exchange and routing key first used")
	yes := fs.Bool("yes", false, "purge: really delete the messages")
	prefix := fs.String("header-prefix", recoverer.DefaultHeaderPrefix, "the prefix the recoverer wrote its headers with (recoverer.WithHeaderPrefix)")
	queue, err := parse(fs, args[2:])
	if err != nil {
		return err
	}
	if *limit < 0 {
		return fmt.Errorf("%w: --limit expects 1 or more (0 or left out: list shows 100, replay takes every message), got %d", errUsage, *limit)
	}
	if *url == "" {
		*url = os.Getenv("AMQP_URL")
	}
	if *url == "" {
		*url = amqpurl.Default
	}
	urls := amqpurl.SplitList(*url)
	if len(urls) == 0 || slices.Contains(urls, "") {
		return fmt.Errorf("%w: --url: an empty address in the list %q", errUsage, amqpurl.Redact(*url))
	}
	for _, u := range urls {
		if _, err := amqpurl.Parse(u); err != nil {
			return fmt.Errorf("%w: --url: %v", errUsage, err)
		}
	}

	switch cmd {
	case "list":
		return withChannel(urls, func(ch *amqp.Channel) error { return list(ctx, ch, queue, *limit, *prefix, stdout) })
	case "show":
		if *id != "" && *index != 0 {
			return fmt.Errorf("%w: show takes --index or --id, not both", errUsage)
		}
		return withChannel(urls, func(ch *amqp.Channel) error { return show(ctx, ch, queue, *index, *id, stdout) })
	case "replay":
		if *to != "" && *toOriginal {
			return fmt.Errorf("%w: replay takes --to or --to-original-exchange, not both", errUsage)
		}
		var re *regexp.Regexp
		if *match != "" {
			if re, err = regexp.Compile(*match); err != nil {
				return fmt.Errorf("%w: --match: %v", errUsage, err)
			}
		}
		return replay(ctx, urls, queue, *limit, re, *to, *toOriginal, *prefix, stdout, stderr)
	case "purge":
		if !*yes {
			return fmt.Errorf("%w: purge deletes every ready message on %s; add --yes to do it", errUsage, queue)
		}
		return withChannel(urls, func(ch *amqp.Channel) error {
			n, err := ch.QueuePurge(queue, false)
			if err != nil {
				return fmt.Errorf("purge %s: %w", queue, err)
			}
			fmt.Fprintf(stdout, "purged %d ready messages from %s (unacked ones stay with their consumers)\n", n, queue)
			return nil
		})
	}
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

// parse accepts flags before and after the one positional QUEUE.
func parse(fs *flag.FlagSet, args []string) (string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return "", fmt.Errorf("%w: %v", errUsage, err)
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(positional) != 1 {
		return "", fmt.Errorf("%w: expected one QUEUE, got %d arguments", errUsage, len(positional))
	}
	return positional[0], nil
}

func withChannel(urls []string, f func(*amqp.Channel) error) error {
	conn, err := amqpconn.Dial(context.Background(), amqpconn.Config{URLs: urls, DialTimeout: 10 * time.Second})
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

// peek takes messages without acking them until stop says so, limit are
// taken or ctx ends; handBack puts them back where they were.
func peek(ctx context.Context, ch *amqp.Channel, queue string, limit int, stop func(amqp.Delivery) bool) ([]amqp.Delivery, error) {
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("queue %s: %w", queue, err)
	}
	n := q.Messages
	if limit > 0 {
		n = min(n, limit)
	}
	var out []amqp.Delivery
	for range n {
		if err := ctx.Err(); err != nil {
			handBack(out)
			return nil, err
		}
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			handBack(out)
			return nil, fmt.Errorf("read %s: %w", queue, err)
		}
		if !ok {
			break
		}
		out = append(out, d)
		if stop != nil && stop(d) {
			break
		}
	}
	return out, nil
}

// handBack returns peeked messages to their queue with basic.nack(requeue):
// looking at a message is not its failure, and from RabbitMQ 4.3 a nack,
// unlike a reject or a closed channel, does not count toward a quorum DLQ's
// delivery limit. 4.0 counts it: a dlx.Topology's quorum DLQ has a limit too
// high to reach, any other quorum queue the broker's (20 on 4.x).
func handBack(msgs []amqp.Delivery) {
	for _, d := range msgs {
		_ = d.Nack(false, true)
	}
}

func list(ctx context.Context, ch *amqp.Channel, queue string, limit int, prefix string, stdout io.Writer) error {
	if limit <= 0 {
		limit = 100
	}
	msgs, err := peek(ctx, ch, queue, limit, nil)
	if err != nil {
		return err
	}
	defer handBack(msgs)
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "#\tMESSAGE ID\tROUTING KEY\tEXCEPTION\tATTEMPTS\tRETRIES\tFAILED AT")
	for i, d := range msgs {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%s\n", i, orDash(escapeLine(d.MessageId)), orDash(escapeLine(originalKey(&d))),
			oneLine(header(&d, recoverer.HeaderExceptionMessage), 60),
			orDash(shownHeader(&d, prefix+recoverer.SuffixAttempts)), dlx.RetryCount(&d),
			orDash(shownHeader(&d, prefix+recoverer.SuffixFailedAt)))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d message(s) shown from %s\n", len(msgs), queue)
	return nil
}

func show(ctx context.Context, ch *amqp.Channel, queue string, index int, id string, stdout io.Writer) error {
	var d *amqp.Delivery
	seen := 0
	msgs, err := peek(ctx, ch, queue, 0, func(m amqp.Delivery) bool {
		seen++
		if (id != "" && m.MessageId == id) || (id == "" && seen == index+1) {
			d = &m
			return true
		}
		return false
	})
	if err != nil {
		return err
	}
	defer handBack(msgs)
	if d == nil {
		if id != "" {
			return fmt.Errorf("no message with id %q on %s (%d messages)", id, queue, len(msgs))
		}
		return fmt.Errorf("no message at index %d on %s (%d messages)", index, queue, len(msgs))
	}
	writeMessage(stdout, d)
	return nil
}

// writeMessage is show's output: every property, header and the body, each
// escaped (render.go).
func writeMessage(w io.Writer, d *amqp.Delivery) {
	fmt.Fprintf(w, "message id:     %s\nrouting key:    %s\nexchange:       %s\ncontent type:   %s\ntimestamp:      %v\nretries:        %d\nheaders:\n",
		escapeLine(d.MessageId), escapeLine(d.RoutingKey), escapeLine(d.Exchange), escapeLine(d.ContentType), d.Timestamp, dlx.RetryCount(d))
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		writeHeader(w, k, d.Headers[k])
	}
	writeBody(w, d.ContentType, d.Body)
}

func replay(ctx context.Context, urls []string, queue string, limit int, re *regexp.Regexp, to string, toOriginal bool, prefix string, stdout, stderr io.Writer) error {
	pub, err := publisher.New(urls[0], publisher.WithURLs(urls...))
	if err != nil {
		return err
	}
	defer pub.Close()
	opts := []dlx.ReplayOption{dlx.ReplayLimit(limit), dlx.ReplayHeaderPrefix(prefix)}
	if re != nil {
		opts = append(opts, dlx.ReplayMatch(func(d *amqp.Delivery) bool {
			return re.MatchString(d.MessageId) || re.MatchString(originalKey(d)) ||
				re.MatchString(header(d, recoverer.HeaderExceptionMessage)) || re.Match(d.Body[:min(len(d.Body), 4096)])
		}))
	}
	switch {
	case to != "":
		opts = append(opts, dlx.ReplayTo(to))
	case toOriginal:
		opts = append(opts, dlx.ReplayToOriginalExchange())
	}
	last := time.Now()
	opts = append(opts, dlx.ReplayProgress(func(s dlx.ReplayStats) {
		if time.Since(last) >= time.Second {
			last = time.Now()
			fmt.Fprintf(stderr, "… %d replayed, %d skipped, %d looked at\n", s.Replayed, s.Skipped, s.Scanned)
		}
	}))
	var stats dlx.ReplayStats
	left := -1
	err = withChannel(urls, func(ch *amqp.Channel) error {
		// A queue that is not there is an error, before anything is said
		// of what was replayed.
		if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("queue %s: %w", queue, err)
		}
		stats, err = dlx.Replay(ctx, ch, pub, queue, opts...)
		if q, qerr := ch.QueueDeclarePassive(queue, true, false, false, false, nil); qerr == nil {
			left = q.Messages
		}
		return err
	})
	if stats.Scanned == 0 && err != nil {
		return err
	}
	fmt.Fprintf(stdout, "replayed %d message(s) from %s", stats.Replayed, queue)
	if stats.Skipped > 0 {
		fmt.Fprintf(stdout, "; %d looked at and left there (not matching or without a destination)", stats.Skipped)
	}
	if left >= 0 {
		fmt.Fprintf(stdout, "; %d message(s) on it now", left)
	}
	fmt.Fprintln(stdout)
	return err
}

// header is a header's value as text, raw, for matching: print it with
// shownHeader.
func header(d *amqp.Delivery, key string) string {
	if v, ok := d.Headers[key]; ok && v != nil {
		return fmt.Sprint(v)
	}
	return ""
}

// shownHeader is a header's value, escaped for one line.
func shownHeader(d *amqp.Delivery, key string) string {
	if v, ok := d.Headers[key]; ok && v != nil {
		return headerValue(v)
	}
	return ""
}

func originalKey(d *amqp.Delivery) string {
	if k := header(d, recoverer.HeaderOriginalRoutingKey); k != "" {
		return k
	}
	return d.RoutingKey
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
