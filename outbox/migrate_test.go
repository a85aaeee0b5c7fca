package outbox_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The table as amqpretry created it before leases (issue 26).
const tableBeforeLeases = `CREATE TABLE %s (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    text        NOT NULL,
    exchange      text        NOT NULL,
    routing_key   text        NOT NULL,
    properties    bytea       NOT NULL,
    body          bytea       NOT NULL,
    status        text        NOT NULL DEFAULT 'in_flight'
                              CHECK (status IN ('in_flight', 'sent', 'failed')),
    retried_count integer     NOT NULL DEFAULT 0,
    next_retry_at timestamptz NOT NULL DEFAULT now(),
    created_at    timestamptz NOT NULL DEFAULT now(),
    sent_at       timestamptz,
    last_error    text
)`

// A table created by an earlier version, holding rows, is brought up to
// date by Migrate (it gains the claim column), and its rows are sent. A
// Migrate on an up-to-date table takes no lock that waits on the table's
// users; one that must add the column gives up after its lock timeout
// instead of queueing every Enqueue behind it.
func TestMigrateBringsATableOfAnEarlierVersionUpToDate(t *testing.T) {
	ob, db, _ := setup(t)
	ctx := context.Background()
	if _, err := db.Exec(`DROP TABLE ` + ob.Table()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(strings.Replace(tableBeforeLeases, "%s", ob.Table(), 1)); err != nil {
		t.Fatal(err)
	}
	q, deliveries := queue(t)
	for i := range 3 {
		writeRaw(t, ob, "", q, amqp.Publishing{MessageId: "old-" + strconv.Itoa(i)})
	}

	// An earlier relay's pass holds the table while the ALTER would wait.
	busy, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := busy.Exec(`SELECT id FROM ` + ob.Table() + ` FOR UPDATE SKIP LOCKED`); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	err = ob.Migrate(ctx)
	if err == nil || !strings.Contains(err.Error(), "lock timeout") {
		t.Fatalf("Migrate during a long transaction: %v after %v, want a lock timeout", err, time.Since(began))
	}
	_ = busy.Rollback()

	for range 2 { // the second finds nothing to do
		if err := ob.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var options string
	if err := db.QueryRow(`SELECT COALESCE(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = $1::regclass`, ob.Table()).Scan(&options); err != nil || options != "fillfactor=50" {
		t.Fatalf("the migrated table's options are %q (%v), want fillfactor=50", options, err)
	}
	busy, err = db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Rollback() }()
	if _, err := busy.Exec(`SELECT id FROM ` + ob.Table() + ` FOR UPDATE SKIP LOCKED`); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := ob.Migrate(mctx); err != nil {
		t.Fatalf("Migrate of an up-to-date table waited on a transaction: %v", err)
	}
	_ = busy.Rollback()

	start(t, ob.Relay(newPublisher(t)))
	for range 3 {
		receive(t, deliveries, 10*time.Second)
	}
}

// Defect 2 of issue 35: Migrate on an up-to-date table queued every writer
// behind the longest open transaction. CREATE INDEX IF NOT EXISTS takes the
// table's SHARE lock even when the index exists, and waited for it with no
// lock_timeout: a business transaction open when a relay started (the docs
// run Migrate at every start) made every other Enqueue wait until it ended.
// Migrate now skips what exists and bounds every lock it takes.
func TestMigrateOfAnUpToDateTableQueuesNoWriter(t *testing.T) {
	ob, db, _ := setup(t)
	ctx := context.Background()
	// A business transaction, open: it holds the table's ROW EXCLUSIVE lock.
	open, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback() }()
	if _, err := ob.Enqueue(ctx, open, "", "q", amqp.Publishing{}); err != nil {
		t.Fatal(err)
	}

	migrated := make(chan error, 1)
	go func() { migrated <- ob.Migrate(ctx) }()
	var migrateErr error
	done := false
	eventually(t, 10*time.Second, "Migrate returned or waits for a lock on the table", func() bool {
		select {
		case migrateErr = <-migrated:
			done = true
			return true
		default:
		}
		var waiting int
		_ = db.QueryRow(`SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND NOT granted`, ob.Table()).Scan(&waiting)
		return waiting > 0
	})

	// Another business transaction writes while the first is still open.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tx, err := db.BeginTx(wctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Enqueue(wctx, tx, "", "q", amqp.Publishing{}); err != nil {
		_ = tx.Rollback()
		t.Fatalf("an Enqueue waited behind Migrate, which waited behind an open transaction: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	_ = open.Rollback()
	if !done {
		migrateErr = <-migrated
	}
	if migrateErr != nil {
		t.Fatalf("Migrate of an up-to-date table: %v", migrateErr)
	}
}
