package outbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/outbox/internal/dbtest"
)

// An "also" of issue 35: the claim scanned the rows waiting out their
// backoff. With 200,000 in-flight rows backed off (a destination down for
// an hour) and 10 due, one claim read every backed-off row (104 ms), and
// every poll of every worker paid it. The claim now finds the due rows by
// an index on what it filters on: it reads about as many pages as it
// claims rows, whatever waits behind them. The measure is the pages the
// statement touches (EXPLAIN's buffers), not its time.
func TestClaimReadsOnlyDueRows(t *testing.T) {
	const backedOff, due = 200000, 10
	ctx := context.Background()
	db := dbtest.DB(t)
	schema := dbtest.Schema(t, db)
	ob, err := New(db, WithTable(schema+".outbox"), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	props, err := encodeProperties(amqp.Publishing{})
	if err != nil {
		t.Fatal(err)
	}
	// Every 20,000th row is due; the others failed five times and wait an hour.
	if _, err := db.Exec(`INSERT INTO `+ob.cfg.table.Quoted+` (message_id, exchange, routing_key, properties, body, retried_count, next_retry_at)
	SELECT 'm' || g, '', 'q', $1, '\x00'::bytea,
	       CASE WHEN g % $2 = 0 THEN 0 ELSE 5 END,
	       CASE WHEN g % $2 = 0 THEN now() ELSE now() + interval '1 hour' END
	FROM generate_series(1, $3) g`, props, (backedOff+due)/due, backedOff+due); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`ANALYZE ` + ob.cfg.table.Quoted); err != nil { // as autovacuum would
		t.Fatal(err)
	}
	r := ob.Relay(unusedPublisher{})
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }() // EXPLAIN ANALYZE runs the claim: undo it
	var plan []struct {
		Plan struct {
			SharedHit  int `json:"Shared Hit Blocks"`
			SharedRead int `json:"Shared Read Blocks"`
		} `json:"Plan"`
		ExecutionTime float64 `json:"Execution Time"`
	}
	var out []byte
	if err := tx.QueryRow(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+r.claimSQL(), r.cfg.batchSize, r.cfg.maxBatchBytes, 1, time.Minute.Milliseconds()).Scan(&out); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, &plan); err != nil || len(plan) != 1 {
		t.Fatalf("EXPLAIN's answer %s: %v", out, err)
	}
	pages := plan[0].Plan.SharedHit + plan[0].Plan.SharedRead
	t.Logf("the claim of %d due rows among %d backed off read %d pages in %.1f ms", due, backedOff, pages, plan[0].ExecutionTime)
	if pages > 500 {
		t.Fatalf("the claim of %d due rows read %d pages: it scans the %d rows waiting out their backoff", due, pages, backedOff)
	}
}
