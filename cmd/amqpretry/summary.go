package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/console"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/recoverer"
)

const dlqSummaryUsage = `amqpretry dlq summary QUEUE [--recent DURATION] [--limit N] [--json] [--url URL] [--header-prefix PREFIX]

Says what failed, how many, since when: QUEUE's depth, and its dead letters
grouped by cause as the console groups them (original queue, error type and
the exception message with its ids, numbers and addresses collapsed), each
group with its count, its first and last failure and how many failed in the
last --recent, largest first. It looks at up to --limit messages, as list
does, handing every one back; a deeper queue is summarised from its head,
and says so.

--json prints one object: queue, depth, looked_at, recent_seconds,
first_failed, last_failed, recent and groups, each with id (the console's
group id), count, recent, original_queue, error_type, cause (the
normalised exception), example (one exception whole), first_failed and
last_failed (RFC 3339, null when unknown).`

func dlqSummary(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dlq summary")
	broker := addBrokerFlags(fs, true)
	limit := fs.Int("limit", console.DefaultLimit, "look at most at `N` messages, from the head of the queue")
	recent := fs.Duration("recent", 15*time.Minute, "count the dead letters that failed in the last `DURATION`")
	asJSON := fs.Bool("json", false, "print a JSON object instead of a table")
	queue, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *limit < 1 {
		return usagef("--limit expects 1 or more, got %d", *limit)
	}
	if *recent <= 0 {
		return usagef("--recent expects a positive duration (10m, 1h), got %v", *recent)
	}
	urls, err := broker.urls()
	if err != nil {
		return err
	}
	return withChannel(urls, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("queue %s: %w", queue, err)
		}
		msgs, err := look(ctx, ch, queue, *limit, nil)
		if err != nil && msgs == nil {
			return err
		}
		warnIf(stderr, err)
		s := summarize(queue, max(q.Messages, len(msgs)), msgs, *broker.prefix, *recent, time.Now())
		if *asJSON {
			return writeJSON(stdout, s)
		}
		return s.write(stdout)
	})
}

// summary is what dlq summary says of a queue; --json prints it.
type summary struct {
	Queue         string         `json:"queue"`
	Depth         int            `json:"depth"`
	LookedAt      int            `json:"looked_at"`
	RecentSeconds int            `json:"recent_seconds"`
	FirstFailed   *jsonTime      `json:"first_failed"`
	LastFailed    *jsonTime      `json:"last_failed"`
	Recent        int            `json:"recent"`
	Groups        []summaryGroup `json:"groups"`
	recent        time.Duration
}

type summaryGroup struct {
	ID            string    `json:"id"`
	Count         int       `json:"count"`
	Recent        int       `json:"recent"`
	OriginalQueue string    `json:"original_queue"`
	ErrorType     string    `json:"error_type"`
	Cause         string    `json:"cause"`
	Example       string    `json:"example"`
	FirstFailed   *jsonTime `json:"first_failed"`
	LastFailed    *jsonTime `json:"last_failed"`
}

func summarize(queue string, depth int, msgs []amqp.Delivery, prefix string, recent time.Duration, now time.Time) summary {
	s := summary{Queue: queue, Depth: depth, LookedAt: len(msgs), RecentSeconds: int(recent.Seconds()), recent: recent, Groups: []summaryGroup{}}
	ms := make([]*console.Message, len(msgs))
	for i := range msgs {
		ms[i] = groupedMessage(msgs[i], i, prefix)
	}
	var first, last time.Time
	for _, g := range console.Groups(ms, console.ByCause) {
		sg := summaryGroup{ID: g.ID, Count: g.Count(), OriginalQueue: g.OriginalQueue, ErrorType: g.ErrorType,
			Cause: g.Signature, Example: g.Example, FirstFailed: optionalTime(g.FirstFailed), LastFailed: optionalTime(g.LastFailed)}
		for _, m := range g.Messages {
			if !m.FailedAt.IsZero() && now.Sub(m.FailedAt) <= recent {
				sg.Recent++
			}
		}
		s.Recent += sg.Recent
		if !g.FirstFailed.IsZero() && (first.IsZero() || g.FirstFailed.Before(first)) {
			first = g.FirstFailed
		}
		if g.LastFailed.After(last) {
			last = g.LastFailed
		}
		s.Groups = append(s.Groups, sg)
	}
	s.FirstFailed, s.LastFailed = optionalTime(first), optionalTime(last)
	return s
}

func optionalTime(t time.Time) *jsonTime {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return (*jsonTime)(&t)
}

func (s summary) write(w io.Writer) error {
	fmt.Fprintf(w, "%s: %d dead letter(s)", escapeLine(s.Queue), s.Depth)
	if s.LookedAt < s.Depth {
		fmt.Fprintf(w, ", the first %d summarised (--limit)", s.LookedAt)
	}
	fmt.Fprintf(w, "; %d failed in the last %v", s.Recent, s.recent)
	if s.FirstFailed != nil {
		fmt.Fprintf(w, "; first %s, last %s", timeText(time.Time(*s.FirstFailed)), timeText(time.Time(*s.LastFailed)))
	}
	fmt.Fprintln(w)
	if len(s.Groups) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nCOUNT\tLAST %v\tFIRST FAILED\tLAST FAILED\tORIGINAL QUEUE\tERROR TYPE\tCAUSE\n", s.recent)
	for _, g := range s.Groups {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\n", g.Count, g.Recent, timeOrDash(g.FirstFailed), timeOrDash(g.LastFailed),
			orDash(escapeLine(g.OriginalQueue)), orDash(escapeLine(g.ErrorType)), oneLine(g.Cause, 70))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d cause(s); amqpretry dlq list %s --match REGEXP (or --error-type TYPE) lists a cause's messages\n", len(s.Groups), escapeLine(s.Queue))
	return nil
}

func timeOrDash(t *jsonTime) string {
	if t == nil {
		return "-"
	}
	return timeText(time.Time(*t))
}

// groupedMessage is what console.Groups reads of a dead letter, read as the
// console reads it (its newMessage, which it does not export): the
// recoverer's original queue, error type, exception and failure time, else,
// for a dead letter the broker made, its x-death's.
func groupedMessage(d amqp.Delivery, index int, prefix string) *console.Message {
	str := func(k string) string { s, _ := d.Headers[k].(string); return s }
	m := &console.Message{Delivery: d, Key: console.Key(&d), Index: index,
		OriginalQueue: str(prefix + recoverer.SuffixOriginalQueue), ErrorType: str(prefix + recoverer.SuffixErrorType),
		Exception: str(recoverer.HeaderExceptionMessage), Stack: str(recoverer.HeaderExceptionStacktrace)}
	if t, err := time.Parse(time.RFC3339Nano, str(prefix+recoverer.SuffixFailedAt)); err == nil {
		m.FailedAt = t
	}
	if deaths := amqphdr.Deaths(d.Headers); len(deaths) > 0 {
		first := deaths[len(deaths)-1]
		if m.OriginalQueue == "" {
			m.OriginalQueue = first.Queue
		}
		if m.ErrorType == "" && first.Reason != "" {
			m.ErrorType = "dead-lettered by the broker: " + first.Reason
		}
		if m.FailedAt.IsZero() {
			m.FailedAt = deaths[0].Time
		}
	}
	if m.OriginalQueue == "" {
		m.OriginalQueue = str(amqphdr.XFirstDeathQueue)
	}
	if m.FailedAt.IsZero() {
		m.FailedAt = d.Timestamp
	}
	return m
}
