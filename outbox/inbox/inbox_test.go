package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/outbox/inbox"
	"github.com/amqpretry/amqpretry/outbox/internal/dbtest"
)

// setup returns an Inbox on a schema of the test's own, and an effects
// table the handlers write to.
func setup(t *testing.T, opts ...inbox.Option) (*inbox.Inbox, *sql.DB, string) {
	t.Helper()
	db := dbtest.DB(t)
	schema := dbtest.Schema(t, db)
	ib, err := inbox.New(db, append([]inbox.Option{inbox.WithTable(schema + ".inbox"), inbox.WithConsumerName("billing"),
		inbox.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE ` + schema + `.effects (message_id text NOT NULL, note text)`); err != nil {
		t.Fatal(err)
	}
	return ib, db, schema
}

// writeEffect is a handler whose effect is a row in effects.
func writeEffect(schema string) inbox.HandlerFunc {
	return func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO `+schema+`.effects (message_id) VALUES ($1)`, d.MessageId)
		return err
	}
}

func count(t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// effects and records count what the handler wrote and what the inbox
// recorded for message id.
func effects(t *testing.T, db *sql.DB, schema, id string) int {
	return count(t, db, `SELECT count(*) FROM `+schema+`.effects WHERE message_id = $1`, id)
}

func records(t *testing.T, db *sql.DB, schema, id string) int {
	return count(t, db, `SELECT count(*) FROM `+schema+`.inbox WHERE message_id = $1`, id)
}

func TestDuplicateIsSkipped(t *testing.T) {
	ib, db, schema := setup(t)
	var calls atomic.Int32
	write := writeEffect(schema)
	h := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		calls.Add(1)
		return write(ctx, tx, d)
	})
	d := &amqp.Delivery{MessageId: "order-1"}
	for i := range 3 {
		if err := h(context.Background(), d); err != nil {
			t.Fatalf("delivery %d: %v", i+1, err)
		}
	}
	if calls.Load() != 1 || effects(t, db, schema, "order-1") != 1 {
		t.Fatalf("handler ran %d times, %d effects; want 1 and 1", calls.Load(), effects(t, db, schema, "order-1"))
	}
}

// A handler's error rolls back its writes and the record, so the retry
// runs the handler again.
func TestHandlerErrorRollsBack(t *testing.T) {
	ib, db, schema := setup(t)
	fail := true
	write := writeEffect(schema)
	h := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if err := write(ctx, tx, d); err != nil {
			return err
		}
		if fail {
			return errors.New("payment service down")
		}
		return nil
	})
	d := &amqp.Delivery{MessageId: "order-2"}
	err := h(context.Background(), d)
	if err == nil || middleware.IsPermanent(err) {
		t.Fatalf("first attempt: %v, want the handler's ordinary error", err)
	}
	if effects(t, db, schema, "order-2") != 0 || records(t, db, schema, "order-2") != 0 {
		t.Fatal("the failed attempt left its effect or its record")
	}
	fail = false
	if err := h(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if effects(t, db, schema, "order-2") != 1 || records(t, db, schema, "order-2") != 1 {
		t.Fatal("the retry did not write its effect and record")
	}
}

// A panic rolls back too, goes on up (CatchPanics makes it an error, as
// the listener does), and the retry processes the message.
func TestPanicRollsBackAndIsRetried(t *testing.T) {
	ib, db, schema := setup(t)
	var calls atomic.Int32
	write := writeEffect(schema)
	h := middleware.CatchPanics()(ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		if err := write(ctx, tx, d); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			panic("nil map")
		}
		return nil
	}))
	d := &amqp.Delivery{MessageId: "order-3"}
	var pe *middleware.PanicError
	if err := h(context.Background(), d); !errors.As(err, &pe) {
		t.Fatalf("first attempt: %v, want a *middleware.PanicError", err)
	}
	if effects(t, db, schema, "order-3") != 0 || records(t, db, schema, "order-3") != 0 {
		t.Fatal("the panicking attempt left its effect or its record")
	}
	if err := h(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if effects(t, db, schema, "order-3") != 1 {
		t.Fatal("the retry did not write its effect")
	}
	// The rolled-back transaction went back to the pool in a usable state.
	if err := db.PingContext(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestMessageWithoutID(t *testing.T) {
	ib, db, schema := setup(t)
	d := &amqp.Delivery{Exchange: "orders", RoutingKey: "created"}
	err := ib.Handler(writeEffect(schema))(context.Background(), d)
	if !middleware.IsPermanent(err) || !errors.Is(err, inbox.ErrNoMessageID) || !strings.Contains(err.Error(), "WithKey") {
		t.Fatalf("%v: want a Permanent ErrNoMessageID that says what to do", err)
	}

	byHeader := func(d *amqp.Delivery) (string, error) {
		id, _ := d.Headers["order-id"].(string)
		return id, nil
	}
	keyed, err := inbox.New(db, inbox.WithTable(schema+".inbox"), inbox.WithConsumerName("billing"), inbox.WithKey(byHeader))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	h := keyed.Handler(func(context.Context, *sql.Tx, *amqp.Delivery) error { calls.Add(1); return nil })
	d.Headers = amqp.Table{"order-id": "o-9"}
	for range 2 {
		if err := h(context.Background(), d); err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 1 || records(t, db, schema, "o-9") != 1 {
		t.Fatalf("keyed by header: %d calls, want 1", calls.Load())
	}
	d.Headers = nil
	if err := h(context.Background(), d); !middleware.IsPermanent(err) || !errors.Is(err, inbox.ErrNoMessageID) {
		t.Fatalf("empty key: %v, want a Permanent ErrNoMessageID", err)
	}
}

// A commit that fails (here a deferred constraint, checked at commit) is an
// ordinary error, so the message is retried; nothing is left behind.
func TestFailedCommitIsRetryable(t *testing.T) {
	ib, db, schema := setup(t)
	if _, err := db.Exec(`CREATE TABLE ` + schema + `.ledger (id int PRIMARY KEY, CONSTRAINT once UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	h := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO `+schema+`.ledger VALUES (1)`)
		return err
	})
	if err := h(context.Background(), &amqp.Delivery{MessageId: "a"}); err != nil {
		t.Fatal(err)
	}
	// The primary key is immediate, so use a deferred-only table for the clash.
	if _, err := db.Exec(`CREATE TABLE ` + schema + `.late (id int, CONSTRAINT late_once UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	h = ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO `+schema+`.late VALUES (1), (1)`) // fine until commit
		return err
	})
	err := h(context.Background(), &amqp.Delivery{MessageId: "b"})
	var ce *inbox.CommitError
	if !errors.As(err, &ce) || middleware.IsPermanent(err) || ce.MessageID != "b" {
		t.Fatalf("%v: want an ordinary *inbox.CommitError for message b", err)
	}
	if records(t, db, schema, "b") != 0 || count(t, db, `SELECT count(*) FROM `+schema+`.late`) != 0 {
		t.Fatal("the failed commit left rows behind")
	}
}

// Two deliveries of one message at once: the second waits on the first's
// record; if the first commits the second skips, if it rolls back the
// second processes the message.
func TestConcurrentDuplicates(t *testing.T) {
	for _, tc := range []struct {
		name       string
		firstFails bool
	}{
		{"first commits", false},
		{"first fails", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ib, db, schema := setup(t)
			release := make(chan struct{})
			var releaseOnce sync.Once
			free := func() { releaseOnce.Do(func() { close(release) }) }
			t.Cleanup(free) // a failing test must not leave the first transaction open
			var calls atomic.Int32
			write := writeEffect(schema)
			h := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
				n := calls.Add(1)
				if err := write(ctx, tx, d); err != nil {
					return err
				}
				if n == 1 {
					<-release // hold the first transaction open
					if tc.firstFails {
						return errors.New("first attempt fails")
					}
				}
				return nil
			})
			d := &amqp.Delivery{MessageId: "dup"}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); errs[0] = h(context.Background(), d) }()
			for calls.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			wg.Add(1)
			go func() { defer wg.Done(); errs[1] = h(context.Background(), d) }()
			// Wait until the second is blocked on the first's row lock.
			deadline := time.Now().Add(10 * time.Second)
			for count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%"'||$1||'"."inbox"%'`, schema) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the second delivery never waited on the first")
				}
				time.Sleep(5 * time.Millisecond)
			}
			free()
			wg.Wait()
			if tc.firstFails {
				if errs[0] == nil || errs[1] != nil || calls.Load() != 2 {
					t.Fatalf("errors %v, %d calls; want the first's error, nil, 2 calls", errs, calls.Load())
				}
			} else if errs[0] != nil || errs[1] != nil || calls.Load() != 1 {
				t.Fatalf("errors %v, %d calls; want nil, nil and 1 call", errs, calls.Load())
			}
			if effects(t, db, schema, "dup") != 1 || records(t, db, schema, "dup") != 1 {
				t.Fatal("want exactly one effect and one record")
			}
		})
	}
}

// Each consumer processes a message once: the record is per consumer.
func TestConsumersAreSeparate(t *testing.T) {
	ib, db, schema := setup(t)
	shipping, err := inbox.New(db, inbox.WithTable(schema+".inbox"), inbox.WithConsumerName("shipping"))
	if err != nil {
		t.Fatal(err)
	}
	d := &amqp.Delivery{MessageId: "order-7"}
	for _, h := range []middleware.Handler{ib.Handler(writeEffect(schema)), shipping.Handler(writeEffect(schema)), ib.Handler(writeEffect(schema))} {
		if err := h(context.Background(), d); err != nil {
			t.Fatal(err)
		}
	}
	if n := effects(t, db, schema, "order-7"); n != 2 {
		t.Fatalf("%d effects, want 2 (billing once, shipping once)", n)
	}
}

// The consumer defaults to the listener's queue; without one and without
// WithConsumerName the error is ordinary, so the message is not lost.
func TestConsumerNameDefaultsToQueue(t *testing.T) {
	_, db, schema := setup(t)
	ib, err := inbox.New(db, inbox.WithTable(schema+".inbox"))
	if err != nil {
		t.Fatal(err)
	}
	h := ib.Handler(writeEffect(schema))
	d := &amqp.Delivery{MessageId: "x"}
	if err := h(context.Background(), d); !errors.Is(err, inbox.ErrNoConsumerName) || middleware.IsPermanent(err) {
		t.Fatalf("%v: want an ordinary ErrNoConsumerName", err)
	}
	if err := h(chainrun.WithQueue(context.Background(), "orders"), d); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM `+schema+`.inbox WHERE consumer = 'orders'`); n != 1 {
		t.Fatalf("%d records for consumer orders, want 1", n)
	}
}

func TestPurge(t *testing.T) {
	ib, db, schema := setup(t)
	h := ib.Handler(func(context.Context, *sql.Tx, *amqp.Delivery) error { return nil })
	for i := range 5 {
		if err := h(context.Background(), &amqp.Delivery{MessageId: fmt.Sprint("old-", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(`UPDATE ` + schema + `.inbox SET processed_at = now() - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	if err := h(context.Background(), &amqp.Delivery{MessageId: "new"}); err != nil {
		t.Fatal(err)
	}
	n, err := ib.Purge(context.Background(), 24*time.Hour)
	if err != nil || n != 5 {
		t.Fatalf("Purge = %d, %v; want 5", n, err)
	}
	if left := count(t, db, `SELECT count(*) FROM `+schema+`.inbox`); left != 1 {
		t.Fatalf("%d records left, want the new one", left)
	}
}

func TestInvalidOptions(t *testing.T) {
	db := dbtest.OpenLazy(t, dbtest.URL())
	for _, tc := range []struct {
		opt  inbox.Option
		want string
	}{
		{inbox.WithTable("In Box"), `WithTable: "In Box"`},
		{inbox.WithConsumerName(""), `WithConsumerName("")`},
		{inbox.WithKey(nil), "WithKey(nil)"},
		{inbox.WithLogger(nil), "WithLogger(nil)"},
	} {
		if _, err := inbox.New(db, tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %s: %v", tc.want, err)
		}
	}
	if _, err := inbox.New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
}

// A database that is down gives an ordinary error (the message is
// retried, not dead-lettered) that never shows the DSN's password.
func TestDatabaseDownIsRetryableAndRedacted(t *testing.T) {
	const password = "inbox-secret-pw"
	proxy, err := faultproxy.Start(dbtest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	proxy.Refuse(true)
	db := dbtest.OpenLazy(t, dbtest.WithHost(t, proxy.Addr(), password))
	ib, err := inbox.New(db, inbox.WithConsumerName("billing"))
	if err != nil {
		t.Fatal(err)
	}
	errs := []error{ib.Migrate(context.Background())}
	_, err = ib.Purge(context.Background(), time.Hour)
	errs = append(errs, err, ib.Handler(func(context.Context, *sql.Tx, *amqp.Delivery) error {
		t.Error("the handler ran without a database")
		return nil
	})(context.Background(), &amqp.Delivery{MessageId: "m"}))
	for _, err := range errs {
		if err == nil || middleware.IsPermanent(err) || strings.Contains(err.Error(), password) {
			t.Errorf("%v: want an ordinary error without the password", err)
		}
	}
}

func TestLongestTableName(t *testing.T) {
	_, db, schema := setup(t)
	long := strings.Repeat("i", 48)
	ib, err := inbox.New(db, inbox.WithTable(schema+"."+long))
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = $2`, schema, long+"_processed_idx"); n != 1 {
		t.Fatalf("index %s_processed_idx: %d found", long, n)
	}
	if !strings.Contains(ib.Schema(), `"`+schema+`"."`+long+`"`) {
		t.Fatalf("Schema names another table:\n%s", ib.Schema())
	}
}
