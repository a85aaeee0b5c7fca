package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/audit"
	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/console"
	"github.com/amqpretry/amqpretry/internal/amqpconn"
)

const dlqDeleteUsage = `amqpretry dlq delete QUEUE [--limit N] [--id ID] [--match REGEXP] [--error-type TYPE] [--archive-type classic|quorum] [--audit FILE | --no-audit] [--url URL] [--header-prefix PREFIX]

Moves the selected messages of QUEUE (every one without --id, --match or
--error-type, which select as for replay) to its archive, the queue
QUEUE.archive, as the console's Delete does: each is published there with
every header it had (x-death, the exception, the recoverer's headers), plus
x-amqpretry-archived-at, -archived-by (the OS user) and -archived-from
(QUEUE), and acked on QUEUE only once the broker has confirmed the copy;
a copy the archive refuses leaves the message on QUEUE. amqpretry dlq
restore puts them back. The archive is an ordinary queue: declared durable
on first use (--archive-type: AMQP does not tell a client QUEUE's type, so
give quorum for a quorum DLQ), used as it is when it exists. Nothing is
deleted for good: amqpretry dlq purge QUEUE.archive does that. It appends
an audit line as replay does.`

const dlqRestoreUsage = `amqpretry dlq restore QUEUE [--limit N] [--id ID | --key KEY] [--match REGEXP] [--error-type TYPE] [--audit FILE | --no-audit] [--url URL] [--header-prefix PREFIX]

Moves messages deleted to an archive back to the queue each was deleted
from (its x-amqpretry-archived-from header), without the archive's
headers and with every other: QUEUE is the dead-letter queue (its archive
QUEUE.archive is read) or the archive itself. Each is acked on the archive
only once the broker has confirmed its copy. --id, --key (as dlq list
shows it), --match, --error-type and --limit select as for replay; without
any, every archived message goes back. It appends an audit line as replay
does.`

// addArchiveTypeFlag is --archive-type, the type a new archive is declared
// with.
func addArchiveTypeFlag(fs *flag.FlagSet) *string {
	return fs.String("archive-type", "classic", "declare a missing archive (DLQ.archive) as a `TYPE` queue: classic, or quorum for a quorum DLQ's; an existing one is used as it is")
}

func dlqDelete(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dlq delete")
	broker := addBrokerFlags(fs, true)
	limit := fs.Int("limit", 0, "archive the `N` oldest failures (0: every one selected)")
	selFlags := addSelectionFlags(fs)
	auditFlags := addAuditFlags(fs)
	id := fs.String("id", "", "only the message(s) with exactly this message `ID`")
	archiveType := addArchiveTypeFlag(fs)
	queue, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *limit < 0 {
		return usagef("--limit expects 1 or more (or 0, the default: every message), got %d", *limit)
	}
	if *archiveType != "classic" && *archiveType != "quorum" {
		return usagef("--archive-type expects classic or quorum, got %q", *archiveType)
	}
	if console.IsArchive(queue) {
		return usagef("%s is an archive already: amqpretry dlq purge %s deletes it for good", queue, queue)
	}
	sel, err := selFlags.selection(*broker.prefix)
	if err != nil {
		return err
	}
	if isSet(fs, "id") && *id == "" {
		return usagef("--id expects a message id")
	}
	sel.id, sel.idSet = *id, isSet(fs, "id")
	urls, err := broker.urls()
	if err != nil {
		return err
	}
	log, err := auditFlags.open(stderr)
	if err != nil {
		return err
	}
	defer log.Close()
	if err := declareArchive(urls, queue, *archiveType); err != nil {
		return err
	}
	archive := console.ArchiveOf(queue)
	m := movement{action: "delete", done: "archived", destination: "queue " + archive,
		opts: console.ArchiveOptions(*broker.prefix, queue, audit.Who(), time.Now()),
		to:   func(*amqp.Delivery) string { return archive }}
	return move(ctx, urls, queue, replaySelection{selection: sel, limit: *limit}, m, *broker.prefix, log, stdout, stderr)
}

func dlqRestore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dlq restore")
	broker := addBrokerFlags(fs, true)
	limit := fs.Int("limit", 0, "restore the `N` oldest failures (0: every one selected)")
	selFlags := addSelectionFlags(fs)
	auditFlags := addAuditFlags(fs)
	id := fs.String("id", "", "only the message(s) with exactly this message `ID`")
	key := fs.String("key", "", "only the message(s) with this `KEY`, as dlq list shows it (id:ID, or fp:FINGERPRINT)")
	queue, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *limit < 0 {
		return usagef("--limit expects 1 or more (or 0, the default: every message), got %d", *limit)
	}
	if isSet(fs, "key") && isSet(fs, "id") {
		return usagef("restore takes --id or --key, not both")
	}
	sel, err := selFlags.selection(*broker.prefix)
	if err != nil {
		return err
	}
	if isSet(fs, "id") && *id == "" {
		return usagef("--id expects a message id")
	}
	sel.id, sel.idSet, sel.key = *id, isSet(fs, "id"), *key
	urls, err := broker.urls()
	if err != nil {
		return err
	}
	log, err := auditFlags.open(stderr)
	if err != nil {
		return err
	}
	defer log.Close()
	archive := queue
	if !console.IsArchive(queue) {
		archive = console.ArchiveOf(queue)
	}
	from := *broker.prefix + console.SuffixArchivedFrom
	m := movement{action: "restore", done: "restored", destination: "the queue each was archived from",
		opts: console.RestoreOptions(*broker.prefix),
		to:   func(d *amqp.Delivery) string { q, _ := d.Headers[from].(string); return q }}
	return move(ctx, urls, archive, replaySelection{selection: sel, limit: *limit}, m, *broker.prefix, log, stdout, stderr)
}

// declareArchive makes sure queue's archive exists (console.DeclareArchive),
// on a connection of its own: a passive declare of a missing queue closes
// its channel.
func declareArchive(urls []string, queue, queueType string) error {
	conn, err := amqpconn.Dial(context.Background(), amqpconn.Config{URLs: urls, DialTimeout: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("connect to %w", err) // err names the address
	}
	defer conn.Close()
	return console.DeclareArchive(conn.Channel, queue, queueType)
}
