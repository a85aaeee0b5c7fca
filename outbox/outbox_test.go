package outbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/internal/dbtest"
)

// A message exists if and only if its transaction committed.
func TestEnqueueOnlyWhatCommits(t *testing.T) {
	ob, db, schema := setup(t)
	q, deliveries := queue(t)
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE ` + schema + `.orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	order := func(id string, commit bool) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(`INSERT INTO `+schema+`.orders VALUES ($1)`, id); err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Enqueue(ctx, tx, "", q, amqp.Publishing{MessageId: id, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	order("order-1", true)
	order("order-2", false)
	order("order-3", true)

	start(t, ob.Relay(newPublisher(t)))
	var got []string
	for range 2 {
		got = append(got, receive(t, deliveries, 10*time.Second).MessageId)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"order-1", "order-3"}) {
		t.Fatalf("delivered %v, want order-1 and order-3", got)
	}
	var rows int
	if err := db.QueryRow(`SELECT count(*) FROM ` + ob.Table()).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 2 {
		t.Fatalf("the outbox holds %d rows, want 2 (the rolled-back one must not exist)", rows)
	}
	select {
	case d := <-deliveries:
		t.Fatalf("an extra message arrived: %q", d.MessageId)
	case <-time.After(300 * time.Millisecond): // six poll intervals
	}
}

// How long from a commit to the consumer, with the default 50ms poll.
// Logged, not asserted: timings on a shared machine vary.
func TestCommitToPublishLatency(t *testing.T) {
	ob, db, _ := setup(t)
	q, deliveries := queue(t)
	start(t, ob.Relay(newPublisher(t)))
	time.Sleep(200 * time.Millisecond) // let the relay's first poll pass
	var lat []time.Duration
	for i := range 40 {
		enqueue(t, db, ob, "", q, amqp.Publishing{Body: []byte{byte(i)}})
		committed := time.Now()
		receive(t, deliveries, 10*time.Second)
		lat = append(lat, time.Since(committed))
		time.Sleep(time.Duration(i%7) * 7 * time.Millisecond) // land at different points of the poll
	}
	slices.Sort(lat)
	t.Logf("commit-to-delivery latency over %d messages, poll interval 50ms: min %v p50 %v p90 %v max %v",
		len(lat), lat[0].Round(time.Millisecond/10), lat[len(lat)/2].Round(time.Millisecond/10),
		lat[len(lat)*9/10].Round(time.Millisecond/10), lat[len(lat)-1].Round(time.Millisecond/10))
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// A row's MessageId is fixed when it is enqueued, so a re-send (here: a
// relay that died after the confirm, before recording it) carries the same.
func TestMessageIDIsStableAcrossResends(t *testing.T) {
	ob, db, _ := setup(t)
	q, deliveries := queue(t)
	generated := enqueue(t, db, ob, "", q, amqp.Publishing{Body: []byte("a")})
	given := enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "order-42", Body: []byte("b")})
	want := map[string]string{"a": row(t, ob, generated).MessageID, "b": "order-42"}
	if !uuidRE.MatchString(want["a"]) {
		t.Fatalf("generated MessageId %q is not a UUID", want["a"])
	}
	stop := start(t, ob.Relay(newPublisher(t)))
	first := map[string]string{}
	for range 2 {
		d := receive(t, deliveries, 10*time.Second)
		first[string(d.Body)] = d.MessageId
	}
	eventually(t, 5*time.Second, "both rows sent", func() bool {
		return statusOf(t, db, ob, generated) == outbox.StatusSent && statusOf(t, db, ob, given) == outbox.StatusSent
	})
	stop()
	if _, err := db.Exec(`UPDATE ` + ob.Table() + ` SET status = 'in_flight', sent_at = NULL`); err != nil {
		t.Fatal(err)
	}
	start(t, ob.Relay(newPublisher(t)))
	second := map[string]string{}
	for range 2 {
		d := receive(t, deliveries, 10*time.Second)
		second[string(d.Body)] = d.MessageId
	}
	for body, id := range want {
		if first[body] != id || second[body] != id {
			t.Errorf("message %q: MessageId %q, then %q; want %q both times", body, first[body], second[body], id)
		}
	}
}

// Every property and header type survives the table and the broker.
func TestPropertiesReachTheConsumer(t *testing.T) {
	ob, db, _ := setup(t)
	q, deliveries := queue(t)
	msg := amqp.Publishing{
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent, Priority: 7,
		CorrelationId: "corr", ReplyTo: "replies", Expiration: "60000", MessageId: "m-1",
		Timestamp: time.Unix(1700000000, 0).UTC(), Type: "order.created", AppId: "shop",
		Headers: amqp.Table{
			"s": "text", "b": true, "i8": int8(-8), "u8": uint8(8), "i16": int16(-16), "u16": uint16(16),
			"i32": int32(-32), "u32": uint32(32), "i64": int64(-1 << 40), "f32": float32(1.5), "f64": 2.25,
			"dec": amqp.Decimal{Scale: 2, Value: 12345}, "bytes": []byte{0, 1, 2}, "nil": nil,
			"time": time.Unix(1600000000, 0).UTC(), "arr": []any{"x", int32(1), []any{true}},
			"tbl": amqp.Table{"nested": amqp.Table{"deep": "yes"}},
		},
		Body: []byte(`{"id":1}`),
	}
	enqueue(t, db, ob, "", q, msg)
	start(t, ob.Relay(newPublisher(t)))
	d := receive(t, deliveries, 10*time.Second)
	got := amqp.Publishing{
		ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode, Priority: d.Priority,
		CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration, MessageId: d.MessageId,
		Timestamp: d.Timestamp.UTC(), Type: d.Type, AppId: d.AppId, Headers: d.Headers, Body: d.Body,
	}
	delete(got.Headers, "traceparent") // the publisher's span context
	if diff := outbox.ComparePublishing(msg, got); diff != "" {
		t.Fatal(diff)
	}
}

// A row the broker refuses is tried WithMaxTries times with backoff, then
// failed with the broker's reason, and never sent; once the cause is fixed,
// Retry or RetryAllFailed sends it.
func TestRefusedRowsFailThenRetryByHand(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reason string // in last_error
		fix    func(t *testing.T, exchange, queue string)
		retry  func(ob *outbox.Outbox, id int64) error
	}{
		{
			name:   "exchange missing",
			reason: "does not exist",
			fix: func(t *testing.T, exchange, queue string) {
				brokertest.Exchange(t, exchange, "fanout")
				brokertest.Bind(t, queue, exchange, "")
			},
			retry: func(ob *outbox.Outbox, id int64) error { return ob.Retry(context.Background(), id) },
		},
		{
			name:   "unroutable",
			reason: "NO_ROUTE",
			fix:    func(t *testing.T, exchange, queue string) { brokertest.Bind(t, queue, exchange, "") },
			retry: func(ob *outbox.Outbox, id int64) error {
				n, err := ob.RetryAllFailed(context.Background())
				if err == nil && n != 1 {
					return errors.New("RetryAllFailed requeued the wrong number of rows")
				}
				return err
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ob, db, _ := setup(t, append(fast, outbox.WithMaxTries(3))...)
			q, deliveries := queue(t)
			exchange := brokertest.Name(t, "x")
			if tc.name == "unroutable" {
				brokertest.Exchange(t, exchange, "fanout")
			}
			id := enqueue(t, db, ob, exchange, "k", amqp.Publishing{Body: []byte("refused")})
			start(t, ob.Relay(newPublisher(t)))
			eventually(t, 10*time.Second, "row failed", func() bool { return statusOf(t, db, ob, id) == outbox.StatusFailed })
			r := row(t, ob, id)
			if r.RetriedCount != 3 || !strings.Contains(r.LastError, tc.reason) || !r.SentAt.IsZero() {
				t.Fatalf("failed row: retried_count %d, last_error %q, sent_at %v; want 3, the broker's %q, none",
					r.RetriedCount, r.LastError, r.SentAt, tc.reason)
			}
			failed, err := ob.List(context.Background(), outbox.ListOptions{Failed: true})
			if err != nil || len(failed) != 1 || failed[0].ID != id {
				t.Fatalf("List(Failed) = %v, %v; want the one failed row", failed, err)
			}
			if counts, err := ob.Counts(context.Background()); err != nil || counts[outbox.StatusFailed] != 1 || counts[outbox.StatusInFlight] != 0 {
				t.Fatalf("Counts = %v, %v; want one failed row", counts, err)
			}
			if err := ob.Retry(context.Background(), id+1000); !errors.Is(err, outbox.ErrNotFound) {
				t.Fatalf("Retry of a missing row: %v, want ErrNotFound", err)
			}

			tc.fix(t, exchange, q)
			if err := tc.retry(ob, id); err != nil {
				t.Fatal(err)
			}
			if d := receive(t, deliveries, 10*time.Second); string(d.Body) != "refused" {
				t.Fatalf("got %q", d.Body)
			}
			eventually(t, 5*time.Second, "row sent", func() bool { return statusOf(t, db, ob, id) == outbox.StatusSent })
			if err := ob.Retry(context.Background(), id); !errors.Is(err, outbox.ErrNotFailed) {
				t.Fatalf("Retry of a sent row: %v, want ErrNotFailed", err)
			}
		})
	}
}

// Get returns one row as List shows it, and a missing one as ErrNotFound.
func TestGet(t *testing.T) {
	ob, db, _ := setup(t)
	enqueue(t, db, ob, "orders", "k0", amqp.Publishing{Body: []byte("first")})
	id := enqueue(t, db, ob, "orders", "k1", amqp.Publishing{MessageId: "order-1", Body: []byte("second")})
	got, err := ob.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	listed, err := ob.List(context.Background(), outbox.ListOptions{})
	if err != nil || len(listed) != 2 {
		t.Fatalf("List = %v, %v", listed, err)
	}
	want := listed[1]
	sameTimes := got.CreatedAt.Equal(want.CreatedAt) && got.NextRetryAt.Equal(want.NextRetryAt) && got.SentAt.Equal(want.SentAt)
	got.CreatedAt, got.NextRetryAt, got.SentAt = want.CreatedAt, want.NextRetryAt, want.SentAt
	if got != want || !sameTimes || got.ID != id || got.MessageID != "order-1" || got.RoutingKey != "k1" || got.BodySize != 6 || got.Status != outbox.StatusInFlight {
		t.Fatalf("Get(%d) = %+v; List shows %+v", id, got, listed[1])
	}
	_, err = ob.Get(context.Background(), id+1000)
	var rse *outbox.RowStateError
	if !errors.Is(err, outbox.ErrNotFound) || !errors.As(err, &rse) || rse.ID != id+1000 {
		t.Fatalf("Get of a missing row: %v, want a *RowStateError matching ErrNotFound", err)
	}
	if want := fmt.Sprintf("outbox: no row with id %d", id+1000); err.Error() != want {
		t.Errorf("Get of a missing row says %q, want %q", err, want)
	}
}

// A message of several megabytes round-trips through bytea and the broker.
func TestHugeBody(t *testing.T) {
	ob, db, _ := setup(t)
	q, deliveries := queue(t)
	body := make([]byte, 8<<20)
	_, _ = rand.Read(body)
	id := enqueue(t, db, ob, "", q, amqp.Publishing{Body: body})
	if r := row(t, ob, id); r.BodySize != len(body) {
		t.Fatalf("BodySize %d, want %d", r.BodySize, len(body))
	}
	start(t, ob.Relay(newPublisher(t)))
	if d := receive(t, deliveries, 30*time.Second); !bytes.Equal(d.Body, body) {
		t.Fatalf("body of %d bytes came back as %d different bytes", len(body), len(d.Body))
	}
}

// Sent rows past the retention are deleted; failed ones are kept.
func TestRetentionDeletesOnlySentRows(t *testing.T) {
	ob, db, _ := setup(t, append(fast, outbox.WithMaxTries(1), outbox.WithRetention(time.Millisecond),
		outbox.WithCleanupInterval(20*time.Millisecond))...)
	q, deliveries := queue(t)
	sent := enqueue(t, db, ob, "", q, amqp.Publishing{Body: []byte("x")})
	failed := enqueue(t, db, ob, brokertest.Name(t, "missing"), "", amqp.Publishing{Body: []byte("y")})
	start(t, ob.Relay(newPublisher(t)))
	receive(t, deliveries, 10*time.Second)
	eventually(t, 10*time.Second, "sent row deleted", func() bool {
		var n int
		_ = db.QueryRow(`SELECT count(*) FROM `+ob.Table()+` WHERE id = $1`, sent).Scan(&n)
		return n == 0
	})
	if s := statusOf(t, db, ob, failed); s != outbox.StatusFailed {
		t.Fatalf("the failed row is %s", s)
	}
}

// Invalid options fail New, naming the option and the value.
func TestInvalidOptions(t *testing.T) {
	db := dbtest.OpenLazy(t, dbtest.URL())
	for _, tc := range []struct {
		opt  outbox.Option
		want string
	}{
		{outbox.WithTable("Orders; DROP"), `WithTable: "Orders; DROP"`},
		{outbox.WithMaxTries(0), "WithMaxTries(0)"},
		{outbox.WithRetryBackoff(time.Second, time.Millisecond), "WithRetryBackoff(1s, 1ms)"},
		{outbox.WithBatchSize(0), "WithBatchSize(0)"},
		{outbox.WithConcurrency(-1), "WithConcurrency(-1)"},
		{outbox.WithWorkers(0), "WithWorkers(0)"},
		{outbox.WithMaxBatchBytes(0), "WithMaxBatchBytes(0)"},
		{outbox.WithPollInterval(0), "WithPollInterval(0s)"},
		{outbox.WithPublishTimeout(-time.Second), "WithPublishTimeout(-1s)"},
		{outbox.WithRetention(-time.Hour), "WithRetention(-1h0m0s)"},
		{outbox.WithCleanupInterval(0), "WithCleanupInterval(0s)"},
		{outbox.WithLogger(nil), "WithLogger(nil)"},
	} {
		if _, err := outbox.New(db, tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %s: %v", tc.want, err)
		}
	}
	ob, err := outbox.New(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Relay(nil).Run(context.Background()); err == nil || !strings.Contains(err.Error(), "publisher is nil") {
		t.Errorf("Relay(nil).Run: %v", err)
	}
	if err := ob.Relay(nil, outbox.WithBatchSize(-5)).Run(context.Background()); err == nil || !strings.Contains(err.Error(), "WithBatchSize(-5)") {
		t.Errorf("Relay with a bad option: %v", err)
	}
	if _, err := ob.Enqueue(context.Background(), nil, "", "q", amqp.Publishing{}); err == nil {
		t.Error("Enqueue without a transaction succeeded")
	}
}

// Enqueue refuses what could never be published, before writing it.
func TestEnqueueRefusesInvalidMessages(t *testing.T) {
	ob, db, _ := setup(t)
	for name, msg := range map[string]amqp.Publishing{
		"unsupported header": {Headers: amqp.Table{"ch": make(chan int)}},
		"long content type":  {ContentType: strings.Repeat("x", 256)},
		"uint64 overflow":    {Headers: amqp.Table{"n": uint64(1 << 63)}},
	} {
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		_, err = ob.Enqueue(context.Background(), tx, "", "q", msg)
		_ = tx.Rollback()
		if !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Errorf("%s: %v, want ErrInvalidMessage", name, err)
		}
	}
}

func TestSchemaIsWhatMigrateRuns(t *testing.T) {
	ob, db, schema := setup(t)
	s := ob.Schema()
	for _, want := range []string{`CREATE TABLE IF NOT EXISTS "` + schema + `"."outbox"`, "WHERE status = 'in_flight'", "CHECK"} {
		if !strings.Contains(s, want) {
			t.Errorf("Schema lacks %q:\n%s", want, s)
		}
	}
	// Migrate twice, and concurrently: IF NOT EXISTS plus the advisory lock.
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- ob.Migrate(context.Background()) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var indexes int
	if err := db.QueryRow(`SELECT count(*) FROM pg_indexes WHERE schemaname = $1`, schema).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if indexes != 5 {
		t.Fatalf("%d indexes, want 5 (primary key, pending, due, sent, failed)", indexes)
	}
}

// A row whose properties cannot be decoded (written by hand, or damaged) is
// failed at once with the reason, never published and never deleted.
func TestCorruptRowIsFailedNotDropped(t *testing.T) {
	ob, db, _ := setup(t)
	q, deliveries := queue(t)
	var id int64
	if err := db.QueryRow(`INSERT INTO `+ob.Table()+` (message_id, exchange, routing_key, properties, body)
		VALUES ('damaged', '', $1, '\x01ff'::bytea, '\x00'::bytea) RETURNING id`, q).Scan(&id); err != nil {
		t.Fatal(err)
	}
	good := enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "good"})
	start(t, ob.Relay(newPublisher(t)))
	if d := receive(t, deliveries, 10*time.Second); d.MessageId != "good" {
		t.Fatalf("published %q", d.MessageId)
	}
	eventually(t, 5*time.Second, "damaged row failed", func() bool { return statusOf(t, db, ob, id) == outbox.StatusFailed })
	if r := row(t, ob, id); r.RetriedCount != 1 || !strings.Contains(r.LastError, "cannot be decoded") {
		t.Fatalf("damaged row: retried_count %d, last_error %q", r.RetriedCount, r.LastError)
	}
	eventually(t, 5*time.Second, "good row sent", func() bool { return statusOf(t, db, ob, good) == outbox.StatusSent })
}

// The longest table name allowed keeps its index names whole (PostgreSQL
// would cut a name past 63 bytes, and two cut names could collide).
func TestLongestTableName(t *testing.T) {
	_, db, schema := setup(t)
	long := strings.Repeat("o", 48)
	ob, err := outbox.New(db, outbox.WithTable(schema+"."+long))
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"_pending_idx", "_sent_idx", "_failed_idx"} {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = $2`, schema, long+suffix).Scan(&n); err != nil || n != 1 {
			t.Errorf("index %s%s: %d found (%v)", long, suffix, n, err)
		}
	}
}

// A relay started before Migrate says what to do, and starts sending once
// the table exists.
func TestRelayBeforeMigrate(t *testing.T) {
	db := dbtest.DB(t)
	schema := dbtest.Schema(t, db)
	logs := &testlog.Buffer{}
	ob, err := outbox.New(db, outbox.WithTable(schema+".outbox"), outbox.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	q, deliveries := queue(t)
	start(t, ob.Relay(newPublisher(t)))
	eventually(t, 10*time.Second, "the relay says to migrate", func() bool { return strings.Contains(logs.String(), "run Outbox.Migrate") })
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db, ob, "", q, amqp.Publishing{MessageId: "after-migrate"})
	if d := receive(t, deliveries, 30*time.Second); d.MessageId != "after-migrate" {
		t.Fatalf("got %q", d.MessageId)
	}
}
