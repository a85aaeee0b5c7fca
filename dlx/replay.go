package dlx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/amqptable"
	"github.com/amqpretry/amqpretry/recoverer"
)

// ReplayStats counts what Replay did.
type ReplayStats struct {
	Scanned  int // taken from the DLQ and looked at
	Replayed int // published (confirmed), then acked on the DLQ
	Skipped  int // left on the DLQ: not matching, no destination, or unreadable
	// Unreadable counts the skipped messages whose headers amqp091-go
	// cannot parse, as a framecheck-guarded connection shows them (the CLI's
	// and the console's): the broker keeps them as they are.
	Unreadable int
}

// ReplayOption configures Replay.
type ReplayOption func(*replayConfig)

type replayConfig struct {
	prefix     string
	limit      int
	match      func(*amqp.Delivery) bool
	toQueue    string
	toOriginal bool
	progress   func(ReplayStats)
	history    bool
	toHeader   string
	asIs       bool
	edit       func(*amqp.Delivery, amqp.Table)
}

// ReplayLimit stops after n messages have been replayed.
func ReplayLimit(n int) ReplayOption { return func(c *replayConfig) { c.limit = n } }

// ReplayMatch replays only the messages for which match returns true; the
// others stay on the DLQ.
func ReplayMatch(match func(d *amqp.Delivery) bool) ReplayOption {
	return func(c *replayConfig) { c.match = match }
}

// ReplayTo sends every message to queue, through the default exchange.
func ReplayTo(queue string) ReplayOption { return func(c *replayConfig) { c.toQueue = queue } }

// ReplayToHeader sends each message to the queue its header name names,
// through the default exchange; a message without that header stays. It
// is how messages moved aside with ReplayAsIs find their way back.
func ReplayToHeader(name string) ReplayOption { return func(c *replayConfig) { c.toHeader = name } }

// ReplayAsIs publishes each message with every header it has, fault, retry
// and death headers included (only CC and BCC go, which would route the
// copy to further queues), then calls edit, if not nil, with the d taken
// and the copy's headers to add or delete some. It is for moving dead
// letters between holding queues (an archive and back), where their
// history must survive; ReplayKeepHistory does nothing with it.
func ReplayAsIs(edit func(d *amqp.Delivery, headers amqp.Table)) ReplayOption {
	return func(c *replayConfig) { c.asIs, c.edit = true, edit }
}

// ReplayToOriginalExchange sends each message to the exchange and routing key
// it was first published with (x-original-exchange, x-original-routingKey,
// or for a dead letter the broker made, its oldest x-death entry), so every
// queue bound there gets it again.
func ReplayToOriginalExchange() ReplayOption { return func(c *replayConfig) { c.toOriginal = true } }

// ReplayHeaderPrefix names the prefix the recoverer wrote its fault headers
// with, when it was not recoverer.DefaultHeaderPrefix (WithHeaderPrefix).
func ReplayHeaderPrefix(prefix string) ReplayOption {
	return func(c *replayConfig) { c.prefix = prefix }
}

// Headers ReplayKeepHistory writes, after the header prefix.
const (
	// SuffixReplayed counts the replays of a message, this one included.
	SuffixReplayed = "replayed"
	// SuffixPreviousException, SuffixPreviousErrorType and
	// SuffixPreviousFailedAt are the exception message (cut to
	// MaxPreviousException bytes), error type and failure time the message
	// had on the DLQ when it was last replayed.
	SuffixPreviousException = "previous-exception"
	SuffixPreviousErrorType = "previous-error-type"
	SuffixPreviousFailedAt  = "previous-failed-at"
)

// MaxPreviousException bounds the exception message ReplayKeepHistory keeps,
// so that the history does not crowd the next failure's own fault headers.
const MaxPreviousException = 1024

// ReplayKeepHistory keeps a replayed message's history: Replay removes the
// fault headers as usual, but adds SuffixReplayed (how often it was
// replayed) and what it last failed with (SuffixPreviousException,
// SuffixPreviousErrorType, SuffixPreviousFailedAt), after the header prefix.
// The recoverer keeps them, so a message that fails again shows on the DLQ
// that it was replayed and why it failed before.
func ReplayKeepHistory() ReplayOption { return func(c *replayConfig) { c.history = true } }

// ReplayProgress calls f after each message.
func ReplayProgress(f func(ReplayStats)) ReplayOption {
	return func(c *replayConfig) { c.progress = f }
}

// Replay moves messages from the dead-letter queue dlq back to work once the
// bug that sent them there is fixed. Each
// message is published with pub, and acked on the DLQ only once the broker has
// confirmed the copy, so an interrupted replay loses nothing (a message caught
// between the two steps is on both queues). Fault, retry and death headers are
// removed, so the message starts over.
//
// By default a message returns to the queue named in its
// x-amqpretry-original-queue header; ReplayTo and ReplayToOriginalExchange
// choose otherwise. A message without a destination, or not matching
// ReplayMatch, stays on the DLQ. Replay looks at each message that was on the
// DLQ when it started once, and returns when it has seen them all, when the
// limit is reached, or when ctx ends; ch is used for basic.get and acks.
// A message whose headers amqp091-go cannot parse (nested below level 32,
// over 8,192 entries: other clients send them) closes ch's connection; on
// a connection dialed through the CLI's guard it arrives marked instead,
// and Replay leaves it on the DLQ and counts it in Unreadable (see
// docs/limitations.md).
// Skipped messages are handed back at the end with basic.nack, which
// RabbitMQ 4.0 counts toward a quorum DLQ's delivery limit (4.3 no longer
// counts a nack): a Topology gives its quorum DLQ a limit of math.MaxInt32
// for that reason (see Topology.DLQArguments), but a quorum DLQ declared
// without x-delivery-limit has RabbitMQ 4's default of 20, and the broker
// drops a dead letter skipped more often than that.
func Replay(ctx context.Context, ch *amqp.Channel, pub recoverer.Publisher, dlq string, opts ...ReplayOption) (ReplayStats, error) {
	cfg := replayConfig{prefix: recoverer.DefaultHeaderPrefix}
	for _, opt := range opts {
		opt(&cfg)
	}
	var stats ReplayStats
	q, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil)
	if err != nil {
		return stats, fmt.Errorf("dlx: replay from %s: %w", dlq, err)
	}
	// Messages left on the DLQ stay unacked until the end, so that basic.get
	// moves past them; then they go back, in their places.
	var held []amqp.Delivery
	defer func() {
		for _, d := range held {
			_ = d.Nack(false, true) // not the message's fault: a nack (RabbitMQ 4.3 on: not counted toward a delivery limit; 4.0 and 3.10 count it)
		}
	}()
	for stats.Scanned < q.Messages && (cfg.limit <= 0 || stats.Replayed < cfg.limit) {
		if err := ctx.Err(); err != nil {
			return stats, err
		}
		d, ok, err := ch.Get(dlq, false)
		if err != nil {
			return stats, fmt.Errorf("dlx: replay from %s: %w%s", dlq, err, frameErrorHint(err))
		}
		if !ok {
			break
		}
		stats.Scanned++
		if _, unreadable := d.Headers[amqphdr.UnreadableHeaders]; unreadable {
			// A guarded connection shows it without its headers: the copy
			// would lose them. The broker holds it intact; it stays.
			held = append(held, d)
			stats.Skipped++
			stats.Unreadable++
			cfg.report(stats)
			continue
		}
		exchange, key := cfg.destination(&d)
		if (cfg.match != nil && !cfg.match(&d)) || (key == "" && exchange == "") {
			held = append(held, d)
			stats.Skipped++
			cfg.report(stats)
			continue
		}
		var msg amqp.Publishing
		switch {
		case cfg.asIs:
			msg = asIs(&d)
			if cfg.edit != nil {
				cfg.edit(&d, msg.Headers)
			}
		default:
			msg = originalMessage(&d, cfg.prefix)
			if cfg.history {
				keepHistory(&d, msg.Headers, cfg.prefix)
			}
		}
		if err := pub.Publish(ctx, exchange, key, msg); err != nil {
			_ = d.Nack(false, true) // not the message's fault: a nack (RabbitMQ 4.3 on: not counted toward a delivery limit; 4.0 and 3.10 count it)
			return stats, fmt.Errorf("dlx: replay message %q to exchange %q, key %q: %w (it stays on %s)", d.MessageId, exchange, key, err, dlq)
		}
		if err := d.Ack(false); err != nil {
			return stats, fmt.Errorf("dlx: message %q was replayed but its ack on %s failed, so it is on both queues: %w", d.MessageId, dlq, err)
		}
		stats.Replayed++
		cfg.report(stats)
	}
	return stats, nil
}

// frameErrorHint explains a connection amqp091-go closed because it could
// not parse a frame: at basic.get, a message's headers.
func frameErrorHint(err error) string {
	var amqpErr *amqp.Error
	if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.FrameError {
		return ""
	}
	return " (the next message's headers are likely ones amqp091-go cannot read: tables or arrays nested deeper than 32 levels, " +
		"or over 8,192 entries; it stays on the queue, and amqpretry dlq replay, whose connection reads past such messages, " +
		"replays the others)"
}

func (c *replayConfig) report(s ReplayStats) {
	if c.progress != nil {
		c.progress(s)
	}
}

// destination is where d goes back to; "", "" when it cannot be told.
func (c *replayConfig) destination(d *amqp.Delivery) (exchange, key string) {
	switch {
	case c.toQueue != "":
		return "", c.toQueue
	case c.toHeader != "":
		queue, _ := d.Headers[c.toHeader].(string)
		return "", queue
	case c.toOriginal:
		// The recoverer's Spring headers, else x-death's oldest entry (a
		// dead letter the broker made).
		exchange, key, _ = amqphdr.FirstPublished(d.Headers)
		return exchange, key
	}
	queue, _ := d.Headers[c.prefix+recoverer.SuffixOriginalQueue].(string)
	if queue == "" {
		// Dead-lettered by the broker itself (Reject, Permanent without a
		// recoverer, a delivery limit): it names the queue it came from.
		queue, _ = d.Headers[amqphdr.XFirstDeathQueue].(string)
	}
	return "", queue
}

// OriginalMessage is the message d's producer sent, as Replay publishes it
// again: d's body and properties with the fault, retry and death headers
// removed (recoverer.DefaultHeaderPrefix).
func OriginalMessage(d *amqp.Delivery) amqp.Publishing {
	return originalMessage(d, recoverer.DefaultHeaderPrefix)
}

func originalMessage(d *amqp.Delivery, prefix string) amqp.Publishing {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if !isFaultOrRetryHeader(k, prefix) {
			headers[k] = v
		}
	}
	msg := amqptable.Publishing(d)
	msg.Headers = headers
	msg.UserId = "" // the republisher may have kept one; only its sender may set it
	return msg
}

// asIs is d as ReplayAsIs publishes it: every header but the sender's
// routing ones.
func asIs(d *amqp.Delivery) amqp.Publishing {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if !amqphdr.IsSenderRouting(k) {
			headers[k] = v
		}
	}
	msg := amqptable.Publishing(d)
	msg.Headers = headers
	msg.UserId = "" // only its sender may set it
	return msg
}

// keepHistory writes into headers, the replayed copy's, the replay count and
// the fault d carried (ReplayKeepHistory).
func keepHistory(d *amqp.Delivery, headers amqp.Table, prefix string) {
	n, _ := amqphdr.Count(d.Headers[prefix+SuffixReplayed])
	headers[prefix+SuffixReplayed] = int64(n + 1)
	text := func(k string) string { s, _ := d.Headers[k].(string); return s }
	exception := text(recoverer.HeaderExceptionMessage)
	if len(exception) > MaxPreviousException {
		cut := MaxPreviousException
		for cut > 0 && !utf8.RuneStart(exception[cut]) {
			cut--
		}
		exception = exception[:cut] + "…"
	}
	for k, v := range map[string]string{
		SuffixPreviousException: exception,
		SuffixPreviousErrorType: text(prefix + recoverer.SuffixErrorType),
		SuffixPreviousFailedAt:  text(prefix + recoverer.SuffixFailedAt),
	} {
		if v != "" {
			headers[prefix+k] = v
		}
	}
}

func isFaultOrRetryHeader(k, prefix string) bool {
	switch k {
	case recoverer.HeaderExceptionMessage, recoverer.HeaderExceptionStacktrace,
		recoverer.HeaderOriginalExchange, recoverer.HeaderOriginalRoutingKey,
		RetryCountHeader:
		return true
	}
	if amqphdr.IsBrokerOwned(k) || amqphdr.IsSenderRouting(k) { // the broker would route a copy to CC again
		return true
	}
	if prefix != "" {
		return strings.HasPrefix(k, prefix)
	}
	// No prefix: our headers are the bare suffixes.
	switch k {
	case recoverer.SuffixOriginalQueue, recoverer.SuffixErrorType, recoverer.SuffixAttempts, recoverer.SuffixFailedAt,
		recoverer.SuffixHost, recoverer.SuffixOriginalExpiration, recoverer.SuffixOriginalUserID, recoverer.SuffixOriginalCC:
		return true
	}
	return false
}
