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
// column: the start says what happened, and the broker's reason (NOT_FOUND,
// NO_ROUTE) follows the exchange's name, which may be long.
const lastErrorWidth = 240

// dispatchOutbox runs "outbox list|retry|schema". Every error it returns
// has been through outbox.Redact by run, so a DSN's password never shows.
func dispatchOutbox(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) < 1 {
		return fmt.Errorf("%w: expected \"outbox list|retry|schema\"", errUsage)
	}
	cmd := args[0]
	fs := flag.NewFlagSet("outbox "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dsn := fs.String("dsn", "", "PostgreSQL connection string")
	table := fs.String("table", outbox.DefaultTable, "the outbox table, optionally schema-qualified")
	inboxTable := fs.String("inbox-table", inbox.DefaultTable, "schema: the inbox (processed messages) table")
	failed := fs.Bool("failed", false, "list: only failed rows")
	limit := fs.Int("limit", 100, "list: at most this many rows, oldest first")
	allFailed := fs.Bool("all-failed", false, "retry: every failed row")
	positional, err := parseAll(fs, args[1:])
	if err != nil {
		return err
	}
	if *dsn == "" {
		*dsn = os.Getenv("DATABASE_URL")
	}

	switch cmd {
	case "schema":
		if len(positional) != 0 {
			return fmt.Errorf("%w: schema takes no arguments, got %q", errUsage, positional)
		}
		return schema(*table, *inboxTable, stdout)
	case "list":
		if len(positional) != 0 {
			return fmt.Errorf("%w: list takes no arguments, got %q", errUsage, positional)
		}
		if *limit < 1 {
			return fmt.Errorf("%w: --limit expects at least 1, got %d", errUsage, *limit)
		}
		return withOutbox(ctx, *dsn, *table, func(ob *outbox.Outbox) error {
			return listRows(ctx, ob, *failed, *limit, stdout)
		})
	case "retry":
		switch {
		case *allFailed && len(positional) != 0:
			return fmt.Errorf("%w: retry takes an ID or --all-failed, not both", errUsage)
		case *allFailed:
			return withOutbox(ctx, *dsn, *table, func(ob *outbox.Outbox) error {
				n, err := ob.RetryAllFailed(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "%d failed row(s) of %s back in flight; a running relay publishes them at once\n", n, ob.Table())
				return nil
			})
		case len(positional) != 1:
			return fmt.Errorf("%w: retry expects one row ID (see outbox list --failed) or --all-failed", errUsage)
		}
		id, err := strconv.ParseInt(positional[0], 10, 64)
		if err != nil || id < 1 {
			return fmt.Errorf("%w: retry: %q is not a row ID (a positive number, as outbox list shows)", errUsage, positional[0])
		}
		return withOutbox(ctx, *dsn, *table, func(ob *outbox.Outbox) error {
			if err := ob.Retry(ctx, id); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "row %d of %s back in flight; a running relay publishes it at once\n", id, ob.Table())
			return nil
		})
	}
	return fmt.Errorf("%w: unknown command \"outbox %s\"", errUsage, cmd)
}

// parseAll accepts flags before, between and after positional arguments.
func parseAll(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
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
func listRows(ctx context.Context, ob *outbox.Outbox, failed bool, limit int, stdout io.Writer) error {
	rows, err := ob.List(ctx, outbox.ListOptions{Failed: failed, Limit: limit})
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tSTATUS\tTRIES\tCREATED\tNEXT TRY / SENT\tEXCHANGE\tROUTING KEY\tMESSAGE ID\tBYTES\tLAST ERROR")
	for _, r := range rows {
		when := "-"
		switch r.Status {
		case outbox.StatusInFlight:
			when = stamp(r.NextRetryAt)
		case outbox.StatusSent:
			when = stamp(r.SentAt)
		}
		fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, escapeLine(string(r.Status)), r.RetriedCount,
			stamp(r.CreatedAt), when, orDash(escapeLine(r.Exchange)), orDash(escapeLine(r.RoutingKey)),
			orDash(escapeLine(r.MessageID)), r.BodySize, oneLine(r.LastError, lastErrorWidth))
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
	if failed && len(rows) > 0 {
		fmt.Fprintln(stdout, "fix the cause (a missing exchange or binding), then: amqpretry outbox retry ID, or --all-failed")
	}
	return nil
}

// stamp is a time for a table cell, in UTC to the second.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}
