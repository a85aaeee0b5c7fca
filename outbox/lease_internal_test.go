package outbox

import (
	"context"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/outbox/internal/dbtest"
)

type unusedPublisher struct{}

func (unusedPublisher) Publish(context.Context, string, string, amqp.Publishing) error {
	panic("not called: the test drives the claims itself")
}

// A claim is a lease: while it lasts no other claim takes the row; once it
// has lapsed another does, and from then on nothing the first claimer
// writes (a late confirm, a late failure) reaches the row: only the
// current claim's outcome does.
func TestALateOutcomeNeverTouchesARowAnotherClaimTook(t *testing.T) {
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
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	id, err := ob.Enqueue(ctx, tx, "", "q", amqp.Publishing{Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := ob.Relay(unusedPublisher{})
	claim := func(token int64, lease time.Duration) int {
		t.Helper()
		rows, _, err := r.claim(ctx, db, token, lease, r.cfg.maxBatchBytes)
		if err != nil {
			t.Fatal(err)
		}
		return len(rows)
	}
	state := func() (status string, tries int, claim int64) {
		t.Helper()
		if err := db.QueryRow(`SELECT status, retried_count, COALESCE(claim, 0) FROM `+ob.cfg.table.Quoted+` WHERE id = $1`, id).Scan(&status, &tries, &claim); err != nil {
			t.Fatal(err)
		}
		return
	}
	sent := func(claim int64) *[]sentRow { return &[]sentRow{{id, claim}} }

	if n := claim(1, 200*time.Millisecond); n != 1 {
		t.Fatalf("the first claim took %d rows, want 1", n)
	}
	if n := claim(2, time.Minute); n != 0 {
		t.Fatalf("a second claim took the row during the first one's lease")
	}
	time.Sleep(300 * time.Millisecond)
	if n := claim(2, time.Minute); n != 1 {
		t.Fatalf("the lapsed lease's row was not claimed again")
	}
	// The first claimer's confirm and failure come in late.
	if err := r.write(ctx, sent(1), nil); err != nil {
		t.Fatal(err)
	}
	reason := "late"
	if err := r.write(ctx, &[]sentRow{}, []outcome{{ID: id, Claim: 1, Tries: 1, Reason: &reason, Status: StatusFailed}}); err != nil {
		t.Fatal(err)
	}
	if status, tries, c := state(); status != "in_flight" || tries != 0 || c != 2 {
		t.Fatalf("after the late outcomes the row is %s, %d tries, claim %d; want in_flight, 0, the second claim's", status, tries, c)
	}
	if err := r.write(ctx, sent(2), nil); err != nil {
		t.Fatal(err)
	}
	if status, _, c := state(); status != "sent" || c != 0 {
		t.Fatalf("after the current claim's confirm the row is %s with claim %d, want sent", status, c)
	}
}
