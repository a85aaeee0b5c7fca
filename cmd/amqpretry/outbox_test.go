package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/inbox"
	"github.com/amqpretry/amqpretry/publisher"
)

// defaultDSN is the database scripts/postgres.sh provides.
const defaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func testDSN() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return defaultDSN
}

// testDB connects to the test database; without one it fails the test
// under AMQPRETRY_REQUIRE_DB=1 (make test) and skips it otherwise.
func testDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", testDSN())
	if err == nil {
		if err = db.Ping(); err != nil {
			_ = db.Close()
		}
	}
	if err != nil {
		msg := fmt.Sprintf("no PostgreSQL at %s: %v (run scripts/postgres.sh to start one)", outbox.Redact(testDSN()), outbox.Redact(err.Error()))
		if os.Getenv("AMQPRETRY_REQUIRE_DB") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// testSchema creates a schema of the test's own and drops it, with the
// tables in it, when the test ends.
func testSchema(t *testing.T, db *sql.DB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "amqpretry_cli_test_" + hex.EncodeToString(b[:])
	if _, err := db.Exec(`CREATE SCHEMA ` + name); err != nil {
		t.Fatalf("create schema %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec(`DROP SCHEMA ` + name + ` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// cli runs the command with the given arguments and no $DATABASE_URL
// lookups of its own beyond what run does.
func cli(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// outboxWithRows migrates an outbox table in a schema of the test's own and
// enqueues n messages, one per transaction; the first has a hostile message
// id and routing key.
func outboxWithRows(t *testing.T, n int) (*sql.DB, *outbox.Outbox, string, []int64) {
	t.Helper()
	db := testDB(t)
	table := testSchema(t, db) + ".outbox"
	ob, err := outbox.New(db, outbox.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := range n {
		msg := amqp.Publishing{MessageId: fmt.Sprintf("order-%d", i), Body: []byte(fmt.Sprintf(`{"order":%d}`, i))}
		key := "orders.created"
		if i == 0 {
			msg.MessageId = "id\x1b[2J\u202e"
			key = "key\r\x1b]52;c;ZXZpbA==\x07"
		}
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		id, err := ob.Enqueue(context.Background(), tx, "orders", key, msg)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return db, ob, table, ids
}

// fail marks rows failed with reason, as a relay does after its last try:
// the relay's own path there is tested in the outbox package.
func fail(t *testing.T, db *sql.DB, table, reason string, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		if _, err := db.Exec(`UPDATE `+table+` SET status = 'failed', retried_count = 10, last_error = $2 WHERE id = $1`, id, reason); err != nil {
			t.Fatal(err)
		}
	}
}

func status(t *testing.T, db *sql.DB, table string, id int64) string {
	t.Helper()
	var s string
	if err := db.QueryRow(`SELECT status FROM `+table+` WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestOutboxListAndRetry(t *testing.T) {
	db, _, table, ids := outboxWithRows(t, 4)
	fail(t, db, table, "Exception (404) Reason: \"NOT_FOUND - no exchange 'orders' in vhost '/'\"\x1b[31m\r\nfaked", ids[0], ids[2])
	dsn := testDSN()

	code, out, errOut := cli("outbox", "list", "--dsn", dsn, "--table", table)
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"ID", "STATUS", "LAST ERROR", "order-1", "order-3", "in_flight", "failed", "NOT_FOUND - no exchange", "4 row(s) shown from " + table, "the table holds 2 in flight, 0 sent, 2 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}

	code, out, errOut = cli("outbox", "list", "--failed", "--dsn", dsn, "--table", table)
	if code != 0 {
		t.Fatalf("list --failed: exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "order-1") || strings.Contains(out, "order-3") || !strings.Contains(out, "order-2") ||
		!strings.Contains(out, "2 failed row(s) shown") || !strings.Contains(out, "amqpretry outbox retry ID") {
		t.Errorf("list --failed should show rows %d and %d only, and how to retry them:\n%s", ids[0], ids[2], out)
	}

	// $DATABASE_URL stands in for --dsn; --limit cuts the oldest first.
	t.Setenv("DATABASE_URL", dsn)
	if code, out, _ := cli("outbox", "list", "--limit", "1", "--table", table); code != 0 || !strings.Contains(out, "1 row(s) shown") ||
		strings.Contains(out, "order-1") {
		t.Errorf("list --limit 1 with $DATABASE_URL: exit %d:\n%s", code, out)
	}

	code, out, errOut = cli("outbox", "retry", fmt.Sprint(ids[2]), "--table", table)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("row %d of %s back in flight", ids[2], table)) {
		t.Fatalf("retry %d: exit %d: %s%s", ids[2], code, out, errOut)
	}
	if s := status(t, db, table, ids[2]); s != "in_flight" {
		t.Errorf("row %d is %s after retry, want in_flight", ids[2], s)
	}
	code, _, errOut = cli("outbox", "retry", fmt.Sprint(ids[2]), "--table", table)
	if code != 1 || !strings.Contains(errOut, "is in_flight, not failed") {
		t.Errorf("retry of a row in flight: exit %d, %q; want 1 and the row's state", code, errOut)
	}
	code, _, errOut = cli("outbox", "retry", "999999", "--table", table)
	if code != 1 || !strings.Contains(errOut, "no row with id 999999 in "+table+" (amqpretry outbox list shows the rows)") || strings.Contains(errOut, "List") {
		t.Errorf("retry of a missing row: exit %d, %q", code, errOut)
	}

	fail(t, db, table, "NO_ROUTE", ids[1])
	code, out, errOut = cli("outbox", "retry", "--all-failed", "--table", table)
	if code != 0 || !strings.Contains(out, "2 failed row(s) of "+table+" back in flight") {
		t.Fatalf("retry --all-failed: exit %d: %s%s", code, out, errOut)
	}
	for _, id := range ids {
		if s := status(t, db, table, id); s != "in_flight" {
			t.Errorf("row %d is %s after retry --all-failed, want in_flight", id, s)
		}
	}
	if code, out, _ := cli("outbox", "retry", "--all-failed", "--table", table); code != 0 || !strings.Contains(out, "0 failed row(s)") {
		t.Errorf("retry --all-failed with none failed: exit %d, %s", code, out)
	}
}

// What a row holds came from a producer or a broker: list shows control
// characters and bidi overrides escaped, never raw.
func TestOutboxListEscapesWhatRowsHold(t *testing.T) {
	db, _, table, ids := outboxWithRows(t, 1)
	fail(t, db, table, "boom\x1b[31m\r\u009b2J\nsecond", ids[0])
	code, out, errOut := cli("outbox", "list", "--dsn", testDSN(), "--table", table)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if n, what := terminalUnsafe(out, true); n > 0 {
		t.Errorf("list printed %d unsafe characters (%s):\n%q", n, what, out)
	}
	for _, want := range []string{`id\x1b[2J\u202e`, `key\r\x1b]52;c;ZXZpbA==\a`, `boom\x1b[31m \u009b2J second`} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks the escaped %s:\n%s", want, out)
		}
	}
}

func TestOutboxSchema(t *testing.T) {
	// schema only prints: it needs no database, and an unreachable one is fine.
	t.Run("no database", func(t *testing.T) {
		t.Setenv("DATABASE_URL", "postgres://app:hunter2@127.0.0.1:1/x")
		code, out, errOut := cli("outbox", "schema", "--table", "app.outbox", "--inbox-table", "app.processed")
		if code != 0 {
			t.Fatalf("schema: exit %d: %s", code, errOut)
		}
		for _, want := range []string{`CREATE TABLE IF NOT EXISTS "app"."outbox"`, `CREATE TABLE IF NOT EXISTS "app"."processed"`, "status", "retried_count", "next_retry_at", "PRIMARY KEY (consumer, message_id)"} {
			if !strings.Contains(out, want) {
				t.Errorf("schema lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "hunter2") {
			t.Errorf("schema printed the password:\n%s", out)
		}
	})

	// What it prints is what Migrate runs, and a DBA can apply it as it is:
	// applied to an empty schema, it makes tables the outbox and the inbox
	// use at once.
	db := testDB(t)
	s := testSchema(t, db)
	code, out, errOut := cli("outbox", "schema", "--table", s+".outbox", "--inbox-table", s+".inbox")
	if code != 0 {
		t.Fatalf("schema: exit %d: %s", code, errOut)
	}
	if _, err := db.Exec(out); err != nil {
		t.Fatalf("the printed schema does not apply: %v\n%s", err, out)
	}
	ob, err := outbox.New(db, outbox.WithTable(s+".outbox"))
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(db, inbox.WithTable(s+".inbox"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, ob.Schema()) || !strings.Contains(out, ib.Schema()) {
		t.Errorf("schema differs from what Migrate runs:\n%s", out)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Enqueue(context.Background(), tx, "x", "k", amqp.Publishing{}); err != nil {
		t.Errorf("Enqueue into the table schema made: %v", err)
	}
	// Rolled back before Migrate, whose CREATE INDEX IF NOT EXISTS waits
	// for the table's writers.
	_ = tx.Rollback()
	if err := ob.Migrate(context.Background()); err != nil {
		t.Errorf("Migrate over the table schema made: %v", err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		t.Errorf("Migrate over the inbox table schema made: %v", err)
	}
}

// A password in the DSN never reaches the terminal, whichever way the
// command fails: the DSN does not parse, the server is not there, refuses
// the database, or the table is missing.
func TestOutboxNeverPrintsThePassword(t *testing.T) {
	const secret = "hunter2secret"
	db := testDB(t)
	u, err := url.Parse(testDSN())
	if err != nil {
		t.Fatal(err)
	}
	withPassword := func(host, database string) string {
		v := *u
		user := "postgres"
		if u.User != nil {
			user = u.User.Username()
		}
		v.User = url.UserPassword(user, secret)
		if host != "" {
			v.Host = host
		}
		if database != "" {
			v.Path = "/" + database
		}
		return v.String()
	}
	// A port with nothing behind it: listen, note the port, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := ln.Addr().String()
	_ = ln.Close()
	missing := testSchema(t, db) + ".nothing_here"

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unparsable URL", []string{"outbox", "list", "--dsn", "postgres://app:" + secret + "@127.0.0.1:notaport/x"}, 2, "--dsn"},
		{"unparsable key/value", []string{"outbox", "list", "--dsn", "host=127.0.0.1 password=" + secret + " port=notaport"}, 2, "--dsn"},
		{"nothing listening", []string{"outbox", "list", "--dsn", withPassword(closedPort, "")}, 1, "cannot connect to PostgreSQL"},
		{"nothing listening, key/value", []string{"outbox", "retry", "--all-failed", "--dsn", "host=127.0.0.1 port=" + strings.Split(closedPort, ":")[1] + " password='" + secret + "' sslmode=disable"}, 1, "cannot connect to PostgreSQL"},
		{"no such database", []string{"outbox", "list", "--dsn", withPassword("", "amqpretry_no_such_db")}, 1, "amqpretry_no_such_db"},
		{"no such table", []string{"outbox", "retry", "7", "--dsn", withPassword("", ""), "--table", missing}, 1, "is --table " + missing + " right?"},
		{"bad table name", []string{"outbox", "list", "--dsn", withPassword("", ""), "--table", "Robert'); DROP TABLE x"}, 2, "--table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := cli(tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, %q; want %d and %q", code, errOut, tc.code, tc.want)
			}
			if strings.Contains(out+errOut, secret) {
				t.Errorf("the password shows:\n%s%s", out, errOut)
			}
		})
	}
}

func TestOutboxUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"outbox", "retry"}, "retry expects one row ID (amqpretry outbox list shows them), got 0 arguments, or --all-failed"},
		{[]string{"outbox", "retry", "abc"}, `"abc" is not a row ID`},
		{[]string{"outbox", "retry", "0"}, `"0" is not a row ID`},
		{[]string{"outbox", "retry", "1", "2"}, "expects one row ID"},
		{[]string{"outbox", "retry", "1", "--all-failed"}, "not both"},
		{[]string{"outbox", "list", "extra"}, "list takes no arguments"},
		{[]string{"outbox", "list", "--limit", "0"}, "--limit expects 1 or more, got 0"},
		{[]string{"outbox", "list", "--limit", "-1"}, "--limit expects 1 or more, got -1"},
		{[]string{"outbox", "list", "--nope"}, "flag provided but not defined: -nope"},
		{[]string{"outbox", "counts", "x"}, "counts takes no arguments"},
		{[]string{"outbox", "show", "x"}, `"x" is not a row ID`},
		{[]string{"outbox", "schema", "--table", "Outbox"}, "--table"},
		{[]string{"outbox", "schema", "--inbox-table", "a.b.c"}, "--inbox-table"},
	} {
		code, _, errOut := cli(tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "usage: amqpretry outbox "+tc.args[1]) {
			t.Errorf("amqpretry %q: exit %d, %q; want 2, %q and its usage", tc.args, code, errOut, tc.want)
		}
	}
	for _, args := range [][]string{{"outbox"}, {"outbox", "frob"}} {
		code, _, errOut := cli(args...)
		if code != 2 || !strings.Contains(errOut, "outbox schema") || strings.Contains(errOut, "dlq list") {
			t.Errorf("amqpretry %q: exit %d, %q; want 2 and the outbox commands", args, code, errOut)
		}
	}
}

// outbox list caps LAST ERROR and says how to see it whole; outbox show
// prints a row with the whole text; --json on list and show gives the
// documented fields; outbox counts counts; times are RFC 3339 to the second.
func TestOutboxShowCountsAndJSON(t *testing.T) {
	db, _, table, ids := outboxWithRows(t, 3)
	long := "Exception (404) Reason: \"NOT_FOUND - no exchange 'orders' in vhost '/'\" " + strings.Repeat("and more ", 30) + "THE END\nsecond line"
	fail(t, db, table, long, ids[1])
	dsn := testDSN()

	code, out, errOut := cli("outbox", "list", "--dsn", dsn, "--table", table)
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "THE END") || !strings.Contains(out, "NOT_FOUND - no exchange") || !strings.Contains(out, "a row's whole last error: amqpretry outbox show ID") {
		t.Errorf("list should cap the last error and say how to see it whole:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if utf8.RuneCountInString(line) > 300 {
			t.Errorf("a line of %d characters:\n%s", utf8.RuneCountInString(line), line)
		}
	}
	if stamps := rfc3339Seconds.FindAllString(out, -1); len(stamps) != 2*3-1 { // created, and next try but for the failed row
		t.Errorf("list shows %d times as RFC 3339 to the second, want 5:\n%s", len(stamps), out)
	}

	code, out, errOut = cli("outbox", "show", fmt.Sprint(ids[1]), "--dsn", dsn, "--table", table)
	if code != 0 {
		t.Fatalf("show: exit %d: %s", code, errOut)
	}
	for _, want := range []string{fmt.Sprintf("id:             %d\n", ids[1]), "status:         failed\n", "tries:          10\n", "sent:           -\n",
		"message id:     order-1\n", "THE END\n    second line\n", "amqpretry outbox retry " + fmt.Sprint(ids[1])} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	if !rfc3339Seconds.MatchString(out) {
		t.Errorf("show's times:\n%s", out)
	}

	code, out, errOut = cli("outbox", "show", fmt.Sprint(ids[1]), "--json", "--dsn", dsn, "--table", table)
	var row map[string]any
	if err := json.Unmarshal([]byte(out), &row); code != 0 || err != nil {
		t.Fatalf("show --json: exit %d (%s), %v:\n%s", code, errOut, err, out)
	}
	want := []string{"id", "status", "tries", "created_at", "next_retry_at", "sent_at", "exchange", "routing_key", "message_id", "body_bytes", "last_error"}
	if keys := slices.Sorted(maps.Keys(row)); !slices.Equal(keys, slices.Sorted(slices.Values(want))) {
		t.Errorf("show --json fields %v, want %v", keys, want)
	}
	if row["id"] != float64(ids[1]) || row["status"] != "failed" || row["tries"] != 10.0 || row["last_error"] != long || row["sent_at"] != nil || row["message_id"] != "order-1" {
		t.Errorf("show --json: %v", row)
	}

	code, out, errOut = cli("outbox", "list", "--json", "--failed", "--dsn", dsn, "--table", table)
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil || len(rows) != 1 || rows[0]["id"] != float64(ids[1]) || rows[0]["last_error"] != long {
		t.Fatalf("list --json --failed: exit %d (%s), %v:\n%s", code, errOut, err, out)
	}

	code, out, errOut = cli("outbox", "counts", "--dsn", dsn, "--table", table)
	if code != 0 || !regexp.MustCompile(`in_flight +2\n`).MatchString(out) || !regexp.MustCompile(`sent +0\n`).MatchString(out) ||
		!regexp.MustCompile(`failed +1\n`).MatchString(out) || !strings.Contains(out, "amqpretry outbox list --failed") {
		t.Errorf("counts: exit %d (%s):\n%s", code, errOut, out)
	}
	code, out, errOut = cli("outbox", "counts", "--json", "--dsn", dsn, "--table", table)
	var counts map[string]int
	if err := json.Unmarshal([]byte(out), &counts); code != 0 || err != nil || counts["in_flight"] != 2 || counts["sent"] != 0 || counts["failed"] != 1 || len(counts) != 3 {
		t.Errorf("counts --json: exit %d (%s), %v:\n%s", code, errOut, err, out)
	}

	code, out, errOut = cli("outbox", "show", "999999", "--dsn", dsn, "--table", table)
	if code != 1 || out != "" || !strings.Contains(errOut, "no row with id 999999 in "+table) || !strings.Contains(errOut, "amqpretry outbox list shows the rows") {
		t.Errorf("show of a missing row: exit %d, %q", code, errOut)
	}
}

// The compensation the seed leaves to a person, with the real relay: a row
// for an exchange nobody declared fails with the broker's reason; list
// --failed shows it; once the exchange and a queue bound to it exist,
// retry puts the row back and the relay delivers it.
func TestOutboxCompensationWithTheRelay(t *testing.T) {
	brokertest.Dial(t)
	db := testDB(t)
	table := testSchema(t, db) + ".outbox"
	ob, err := outbox.New(db, outbox.WithTable(table), outbox.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	exchange, queue := brokertest.Name(t, "orders"), brokertest.Name(t, "shipping")
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	id, err := ob.Enqueue(context.Background(), tx, exchange, "order.created", amqp.Publishing{MessageId: "order-7", Body: []byte(`{"order":7}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	pub, err := publisher.New(brokertest.URL(), publisher.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- ob.Relay(pub, outbox.WithMaxTries(1), outbox.WithPollInterval(10*time.Millisecond)).Run(ctx)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the relay: %v", err)
		}
	}()

	brokertest.Eventually(t, 10*time.Second, "the row failed by the relay", func() bool { return status(t, db, table, id) == "failed" })
	code, out, errOut := cli("outbox", "list", "--failed", "--dsn", testDSN(), "--table", table)
	if code != 0 || !strings.Contains(out, "order-7") || !strings.Contains(out, "1 failed row(s)") {
		t.Fatalf("list --failed: exit %d (%s), want the row:\n%s", code, errOut, out)
	}
	code, out, errOut = cli("outbox", "show", fmt.Sprint(id), "--dsn", testDSN(), "--table", table)
	if code != 0 || !strings.Contains(out, "does not exist") {
		t.Fatalf("show %d: exit %d (%s), want the broker's reason:\n%s", id, code, errOut, out)
	}

	brokertest.Exchange(t, exchange, "direct")
	brokertest.Queue(t, queue, nil)
	brokertest.Bind(t, queue, exchange, "order.created")
	if code, out, errOut := cli("outbox", "retry", fmt.Sprint(id), "--dsn", testDSN(), "--table", table); code != 0 {
		t.Fatalf("retry: exit %d: %s%s", code, out, errOut)
	}
	brokertest.Eventually(t, 10*time.Second, "the row sent after the retry", func() bool { return status(t, db, table, id) == "sent" })
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), queue)
	if !ok || d.MessageId != "order-7" || string(d.Body) != `{"order":7}` {
		t.Errorf("the queue holds %q (%v), want order-7", d.MessageId, ok)
	}
	if code, out, _ := cli("outbox", "list", "--failed", "--dsn", testDSN(), "--table", table); code != 0 || !strings.Contains(out, "0 failed row(s)") {
		t.Errorf("list --failed after the retry: exit %d:\n%s", code, out)
	}
}
