// Package pgsql holds what the outbox and the inbox share about talking to
// PostgreSQL through database/sql: checked table names and the redaction of
// passwords from any text that reaches a log line or an error.
package pgsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// A table name is one or two parts (schema.table), each a lowercase SQL
// identifier. Lowercase only, so that the quoted name in our statements and
// the unquoted name a DBA types in psql are the same table. The table part
// leaves room under PostgreSQL's 63-byte limit for the index suffixes.
var (
	schemaPart = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	tablePart  = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)
)

// Table is a validated table name: Quoted for statements, Base (the table
// part, unquoted) to derive index names from.
type Table struct {
	Quoted string
	Base   string
	Name   string // as the user gave it
}

// ParseTable checks name and quotes it. The error says what is allowed.
func ParseTable(name string) (Table, error) {
	schema, table, qualified := strings.Cut(name, ".")
	if !qualified {
		schema, table = "", name
	}
	if !tablePart.MatchString(table) || (qualified && !schemaPart.MatchString(schema)) {
		return Table{}, fmt.Errorf("%q is not a table name this package accepts: use lowercase letters, digits and _ (not first), at most 48 bytes, optionally after a schema and a dot (\"app.outbox\")", name)
	}
	q := `"` + table + `"`
	if qualified {
		q = `"` + schema + `".` + q
	}
	return Table{Quoted: q, Base: table, Name: name}, nil
}

// Index returns the quoted name of the table's index with suffix (at most
// 15 bytes, to stay under PostgreSQL's 63); PostgreSQL puts an index in its
// table's schema, so the name is never qualified.
func (t Table) Index(suffix string) string { return `"` + t.Base + "_" + suffix + `"` }

// Passwords may sit in a URL (postgres://user:secret@host/db) or in a
// keyword/value string (password=secret or password='se cret'), and a driver
// may quote either in its errors.
var (
	urlPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^\s]*@`)
	kvPassword  = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s]+)`)
)

// Mask replaces a hidden password.
const Mask = "xxxxx"

// Redact hides every password in text: in URLs (scheme://user:password@...)
// and in keyword/value connection strings (password=...).
func Redact(text string) string {
	if !strings.Contains(text, "@") && !strings.Contains(strings.ToLower(text), "password") {
		return text
	}
	text = urlPassword.ReplaceAllString(text, "${1}"+Mask+"@")
	return kvPassword.ReplaceAllString(text, "${1}"+Mask)
}

// RedactedError keeps an error's chain for errors.Is and errors.As while its
// text is redacted.
type RedactedError struct{ Err error }

func (e *RedactedError) Error() string { return Redact(e.Err.Error()) }
func (e *RedactedError) Unwrap() error { return e.Err }

// RedactErr wraps err so that its text never shows a password; nil stays nil.
func RedactErr(err error) error {
	if err == nil {
		return nil
	}
	return &RedactedError{Err: err}
}

// UndefinedTable reports whether err is PostgreSQL's 42P01, "relation does
// not exist", as any driver whose errors have a SQLState method (pgx,
// lib/pq) reports it.
func UndefinedTable(err error) bool {
	var coded interface{ SQLState() string }
	return errors.As(err, &coded) && coded.SQLState() == "42P01"
}

// MigrateLockTimeout bounds each lock Migrate waits for.
const MigrateLockTimeout = "5s"

// indexCreated returns the (quoted) name of the index stmt creates, if it
// is a CREATE INDEX IF NOT EXISTS.
func indexCreated(stmt string) (string, bool) {
	rest, ok := strings.CutPrefix(stmt, "CREATE INDEX IF NOT EXISTS ")
	if !ok {
		return "", false
	}
	name, _, ok := strings.Cut(rest, " ")
	return name, ok
}

// qualify puts an index name in the table's schema, where PostgreSQL puts
// the table's indexes.
func (t Table) qualify(index string) string {
	if schema, _, ok := strings.Cut(t.Quoted, "."); ok {
		return schema + "." + index
	}
	return index
}

// Migrate runs ddl in one transaction, under an advisory lock named after
// the table, so that processes starting together do not race on CREATE ...
// IF NOT EXISTS (which is not safe against a concurrent create).
func Migrate(ctx context.Context, db *sql.DB, t Table, ddl []string) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", t.Name, RedactErr(err))
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if _, err = tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "amqpretry migrate "+t.Name); err != nil {
		return fmt.Errorf("migrate %s: %w", t.Name, RedactErr(err))
	}
	// Every lock the migration takes is bounded: one that waits behind a
	// long transaction (a business write, a handler) would queue every
	// writer of the table behind itself. It fails instead, and Migrate can
	// be run again.
	if _, err = tx.ExecContext(ctx, `SET LOCAL lock_timeout = '`+MigrateLockTimeout+`'`); err != nil {
		return fmt.Errorf("migrate %s: %w", t.Name, RedactErr(err))
	}
	for _, stmt := range ddl {
		// CREATE INDEX IF NOT EXISTS takes the table's SHARE lock even when
		// the index exists, so one that exists is not created again.
		if name, ok := indexCreated(stmt); ok {
			var exists bool
			if err = tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.qualify(name)).Scan(&exists); err != nil {
				return fmt.Errorf("migrate %s: %w", t.Name, RedactErr(err))
			}
			if exists {
				continue
			}
		}
		if _, err = tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("migrate %s: %w", t.Name, RedactErr(err))
		}
	}
	if err = tx.Commit(); err != nil {
		return fmt.Errorf("migrate %s: commit: %w", t.Name, RedactErr(err))
	}
	return nil
}
