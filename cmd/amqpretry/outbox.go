package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/inbox"
)

// connectTimeout bounds the wait for the database: an operator at a
// terminal wants an error, not a hang, when the DSN points nowhere.
const connectTimeout = 10 * time.Second

// lastErrorWidth is how much of a row's last error list shows, in the last
// column: the start says what happened (Exception (404) Reason: "NOT_FOUND -
// no exchange ...); outbox show prints the whole text.
const lastErrorWidth = 72

const outboxListUsage = `amqpretry outbox list [--failed] [--limit N] [--json] [--dsn DSN] [--table NAME]

Lists the rows of the outbox table, oldest first: id, status, tries, when
created, when next tried (in flight) or sent, exchange, routing key, message
id, body size and the start of the last error (outbox show prints it whole),
then how many rows the table holds per status.

--json prints a JSON array instead, one object per row, with the fields
  id, status (in_flight, sent, failed), tries (failed publishes so far),
  created_at, next_retry_at, sent_at (RFC 3339; sent_at null until sent),
  exchange, routing_key, message_id, body_bytes, last_error (whole).`

const outboxShowUsage = `amqpretry outbox show ID [--json] [--dsn DSN] [--table NAME]

Prints the row ID of the outbox table, its last error whole. --json prints
the object outbox list --json prints for the row.`

const outboxCountsUsage = `amqpretry outbox counts [--json] [--dsn DSN] [--table NAME]

Counts the rows of the outbox table in each status: in_flight (waiting for
the relay, or being published), sent, failed (waiting for amqpretry outbox
retry). --json prints {"in_flight": N, "sent": N, "failed": N}.`

const outboxRetryUsage = `amqpretry outbox retry ID | --all-failed [--dsn DSN] [--table NAME]

Puts a failed row (or every one) back in flight, due at once, its tries
counted from zero: run it once the cause (a missing exchange or binding) is
fixed. A running relay publishes the rows at once.`

const outboxSchemaUsage = `amqpretry outbox schema [--table NAME] [--inbox-table NAME]

Prints the DDL of the outbox table and of the inbox table (the message ids
a consumer has processed), the statements the library's Migrate runs, for a
DBA to review or apply. It connects to no database.`

// databaseFlags are the flags of the commands that reach the outbox table.
type databaseFlags struct{ dsn, table *string }

func addDatabaseFlags(fs *flag.FlagSet) databaseFlags {
	return databaseFlags{
		dsn:   fs.String("dsn", "", "the PostgreSQL connection string, `DSN` (default $DATABASE_URL)"),
		table: fs.String("table", outbox.DefaultTable, "the outbox table, `NAME` or SCHEMA.NAME"),
	}
}

// with connects to the database and runs f on the Outbox of --table.
func (d databaseFlags) with(ctx context.Context, f func(*outbox.Outbox) error) error {
	dsn := *d.dsn
	if dsn == "" {
		dsn = os.Getenv("DATABASE_URL")
	}
	return withOutbox(ctx, dsn, *d.table, f)
}

// noArguments is a usage error unless positional is empty.
func noArguments(name string, positional []string) error {
	if len(positional) != 0 {
		return usagef("%s takes no arguments, got %q", name, positional)
	}
	return nil
}

// rowID reads the one ID argument of show and retry.
func rowID(name string, positional []string) (int64, error) {
	if len(positional) != 1 {
		return 0, usagef("%s expects one row ID (amqpretry outbox list shows them), got %d arguments", name, len(positional))
	}
	id, err := strconv.ParseInt(positional[0], 10, 64)
	if err != nil || id < 1 {
		return 0, usagef("%s: %q is not a row ID (a positive number, as outbox list shows)", name, positional[0])
	}
	return id, nil
}

// notFound adds to a missing row's error where the ids are.
func notFound(err error, ob *outbox.Outbox) error {
	if errors.Is(err, outbox.ErrNotFound) {
		return fmt.Errorf("%w in %s (amqpretry outbox list shows the rows)", err, ob.Table())
	}
	return err
}

func outboxList(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlags("outbox list")
	db := addDatabaseFlags(fs)
	failed := fs.Bool("failed", false, "only failed rows")
	limit := fs.Int("limit", 100, "at most `N` rows, oldest first")
	asJSON := fs.Bool("json", false, "print a JSON array, one object per row, instead of a table")
	positional, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	if err := noArguments("list", positional); err != nil {
		return err
	}
	if *limit < 1 {
		return usagef("--limit expects 1 or more, got %d", *limit)
	}
	return db.with(ctx, func(ob *outbox.Outbox) error { return listRows(ctx, ob, *failed, *limit, *asJSON, stdout) })
}

func outboxShow(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlags("outbox show")
	db := addDatabaseFlags(fs)
	asJSON := fs.Bool("json", false, "print the row as a JSON object")
	positional, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	id, err := rowID("show", positional)
	if err != nil {
		return err
	}
	return db.with(ctx, func(ob *outbox.Outbox) error {
		r, err := ob.Get(ctx, id)
		if err != nil {
			return notFound(err, ob)
		}
		if *asJSON {
			return writeJSON(stdout, rowOf(r))
		}
		writeRow(stdout, r)
		if r.Status == outbox.StatusFailed {
			fmt.Fprintf(stdout, "fix the cause (a missing exchange or binding), then: amqpretry outbox retry %d\n", r.ID)
		}
		return nil
	})
}

func outboxCounts(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlags("outbox counts")
	db := addDatabaseFlags(fs)
	asJSON := fs.Bool("json", false, `print {"in_flight": N, "sent": N, "failed": N}`)
	positional, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	if err := noArguments("counts", positional); err != nil {
		return err
	}
	return db.with(ctx, func(ob *outbox.Outbox) error {
		counts, err := ob.Counts(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, counts)
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "STATUS\tROWS")
		for _, s := range []outbox.Status{outbox.StatusInFlight, outbox.StatusSent, outbox.StatusFailed} {
			fmt.Fprintf(w, "%s\t%d\n", s, counts[s])
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if counts[outbox.StatusFailed] > 0 {
			fmt.Fprintln(stdout, "amqpretry outbox list --failed shows the failed rows")
		}
		return nil
	})
}

func outboxRetry(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlags("outbox retry")
	db := addDatabaseFlags(fs)
	allFailed := fs.Bool("all-failed", false, "every failed row")
	positional, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	if *allFailed {
		if len(positional) != 0 {
			return usagef("retry takes an ID or --all-failed, not both")
		}
		return db.with(ctx, func(ob *outbox.Outbox) error {
			n, err := ob.RetryAllFailed(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%d failed row(s) of %s back in flight; a running relay publishes them at once\n", n, ob.Table())
			return nil
		})
	}
	id, err := rowID("retry", positional)
	if err != nil {
		return usagef("%v, or --all-failed", strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
	}
	return db.with(ctx, func(ob *outbox.Outbox) error {
		if err := ob.Retry(ctx, id); err != nil {
			return notFound(err, ob)
		}
		fmt.Fprintf(stdout, "row %d of %s back in flight; a running relay publishes it at once\n", id, ob.Table())
		return nil
	})
}

func outboxSchema(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlags("outbox schema")
	table := fs.String("table", outbox.DefaultTable, "the outbox table, `NAME` or SCHEMA.NAME")
	inboxTable := fs.String("inbox-table", inbox.DefaultTable, "the inbox (processed messages) table, `NAME` or SCHEMA.NAME")
	positional, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	if err := noArguments("schema", positional); err != nil {
		return err
	}
	return schema(*table, *inboxTable, stdout)
}

// parseAll accepts flags before, between and after positional arguments.
// For -h or --help it returns a *helpRequest.
func parseAll(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, &helpRequest{fs: fs}
			}
			return nil, usagef("%v", err)
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// openDB checks dsn and opens a pool on it, without connecting yet. The
// driver would report a DSN that does not parse only when it connects, as
// if the server were at fault: checked here, it is the usage error it is.
func openDB(dsn string) (*sql.DB, error) {
	if _, err := pgx.ParseConfig(dsn); err != nil {
		return nil, fmt.Errorf("%w: --dsn (or $DATABASE_URL): %v", errUsage, err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("--dsn (or $DATABASE_URL) %s: %w", dsn, err)
	}
	return db, nil
}

// schema prints the DDL that Outbox.Migrate and Inbox.Migrate run, for a
// DBA to review or apply. It never connects: the pool it hands New is only
// there because New wants one.
func schema(table, inboxTable string, stdout io.Writer) error {
	db, err := sql.Open("pgx", "")
	if err != nil {
		return err
	}
	defer db.Close()
	ob, err := outbox.New(db, outbox.WithTable(table))
	if err != nil {
		return fmt.Errorf("%w: --table: %v", errUsage, err)
	}
	ib, err := inbox.New(db, inbox.WithTable(inboxTable))
	if err != nil {
		return fmt.Errorf("%w: --inbox-table: %v", errUsage, err)
	}
	fmt.Fprintf(stdout, "-- The outbox table %s: the producer's messages, written in its business transactions\n", table)
	fmt.Fprintf(stdout, "-- (outbox.Outbox.Migrate runs the same statements).\n\n%s\n", ob.Schema())
	fmt.Fprintf(stdout, "-- The inbox table %s: the message ids a consumer has processed, recorded in its\n", inboxTable)
	fmt.Fprintf(stdout, "-- handler's transaction (inbox.Inbox.Migrate runs the same statements).\n\n%s", ib.Schema())
	return nil
}

// withOutbox connects to the database and runs f on an Outbox of table.
func withOutbox(ctx context.Context, dsn, table string, f func(*outbox.Outbox) error) error {
	db, err := openDB(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ob, err := outbox.New(db, outbox.WithTable(table))
	if err != nil {
		return fmt.Errorf("%w: --table: %v", errUsage, err)
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		where := dsn
		if where == "" {
			where = "(no --dsn and no $DATABASE_URL: libpq's defaults)"
		}
		return fmt.Errorf("cannot connect to PostgreSQL at %s: %w", where, err)
	}
	err = f(ob)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == undefinedTable {
		return fmt.Errorf("%w\nis --table %s right? The outbox's Migrate creates the table; `amqpretry outbox schema` prints its DDL", err, table)
	}
	return err
}

// undefinedTable is PostgreSQL's SQLSTATE for a table that does not exist.
const undefinedTable = "42P01"

// listRows prints rows as a table. Whatever a row holds came from a
// producer (exchange, routing key, message id) or the broker (the last
// error), so every such cell is escaped as dlq list escapes a dead letter.
func listRows(ctx context.Context, ob *outbox.Outbox, failed bool, limit int, asJSON bool, stdout io.Writer) error {
	rows, err := ob.List(ctx, outbox.ListOptions{Failed: failed, Limit: limit})
	if err != nil {
		return err
	}
	if asJSON {
		out := make([]rowJSON, 0, len(rows))
		for _, r := range rows {
			out = append(out, rowOf(r))
		}
		return writeJSON(stdout, out)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tSTATUS\tTRIES\tCREATED\tNEXT TRY / SENT\tEXCHANGE\tROUTING KEY\tMESSAGE ID\tBYTES\tLAST ERROR")
	cut := false
	for _, r := range rows {
		when := "-"
		switch r.Status {
		case outbox.StatusInFlight:
			when = timeText(r.NextRetryAt)
		case outbox.StatusSent:
			when = timeText(r.SentAt)
		}
		lastError := oneLine(r.LastError, lastErrorWidth)
		cut = cut || strings.HasSuffix(lastError, "…")
		fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, escapeLine(string(r.Status)), r.RetriedCount,
			timeText(r.CreatedAt), when, orDash(escapeLine(r.Exchange)), orDash(escapeLine(r.RoutingKey)),
			orDash(escapeLine(r.MessageID)), r.BodySize, lastError)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	which := "row(s)"
	if failed {
		which = "failed row(s)"
	}
	counts, err := ob.Counts(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d %s shown from %s, oldest first (at most %d: --limit); the table holds %d in flight, %d sent, %d failed\n",
		len(rows), which, ob.Table(), limit, counts[outbox.StatusInFlight], counts[outbox.StatusSent], counts[outbox.StatusFailed])
	if cut {
		fmt.Fprintln(stdout, "a row's whole last error: amqpretry outbox show ID")
	}
	if failed && len(rows) > 0 {
		fmt.Fprintln(stdout, "fix the cause (a missing exchange or binding), then: amqpretry outbox retry ID, or --all-failed")
	}
	return nil
}

// rowJSON is one row of outbox list --json and outbox show --json;
// outboxListUsage documents the fields, whose names do not change.
type rowJSON struct {
	ID          int64      `json:"id"`
	Status      string     `json:"status"`
	Tries       int        `json:"tries"`
	CreatedAt   time.Time  `json:"created_at"`
	NextRetryAt time.Time  `json:"next_retry_at"`
	SentAt      *time.Time `json:"sent_at"`
	Exchange    string     `json:"exchange"`
	RoutingKey  string     `json:"routing_key"`
	MessageID   string     `json:"message_id"`
	BodyBytes   int        `json:"body_bytes"`
	LastError   string     `json:"last_error"`
}

func rowOf(r outbox.Row) rowJSON {
	j := rowJSON{ID: r.ID, Status: string(r.Status), Tries: r.RetriedCount, CreatedAt: r.CreatedAt.UTC(), NextRetryAt: r.NextRetryAt.UTC(),
		Exchange: r.Exchange, RoutingKey: r.RoutingKey, MessageID: r.MessageID, BodyBytes: r.BodySize, LastError: r.LastError}
	if !r.SentAt.IsZero() {
		sent := r.SentAt.UTC()
		j.SentAt = &sent
	}
	return j
}

// writeRow is outbox show's output: every field, escaped, the last error
// whole, its line breaks kept and its further lines indented.
func writeRow(w io.Writer, r outbox.Row) {
	fmt.Fprintf(w, "id:             %d\nstatus:         %s\ntries:          %d\ncreated:        %s\nnext try:       %s\nsent:           %s\n",
		r.ID, escapeLine(string(r.Status)), r.RetriedCount, timeText(r.CreatedAt), timeText(r.NextRetryAt), timeText(r.SentAt))
	fmt.Fprintf(w, "exchange:       %s\nrouting key:    %s\nmessage id:     %s\nbody:           %d bytes\n",
		orDash(escapeLine(r.Exchange)), orDash(escapeLine(r.RoutingKey)), orDash(escapeLine(r.MessageID)), r.BodySize)
	if r.LastError == "" {
		fmt.Fprintln(w, "last error:     -")
		return
	}
	fmt.Fprintf(w, "last error:\n    %s\n", strings.ReplaceAll(escapeBlock(r.LastError), "\n", "\n    "))
}
