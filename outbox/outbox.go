package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqptable"
	"github.com/amqpretry/amqpretry/outbox/internal/pgsql"
)

// Outbox writes messages into its table inside the caller's transactions,
// and relays publish them. It is safe for concurrent use.
type Outbox struct {
	db  *sql.DB
	cfg config
}

// Status is a row's state: StatusInFlight, StatusSent or StatusFailed.
type Status string

const (
	// StatusInFlight: waiting to be published, or to be published again
	// after a failed try.
	StatusInFlight Status = "in_flight"
	// StatusSent: the broker confirmed the message.
	StatusSent Status = "sent"
	// StatusFailed: every try failed, or the message can never be sent;
	// the row waits for a person to fix the cause and call Retry.
	StatusFailed Status = "failed"
)

// New returns an Outbox on db. It checks every option and reports each
// problem with the option's name and value; it does not touch the database
// (call Migrate to create the table).
func New(db *sql.DB, opts ...Option) (*Outbox, error) {
	cfg := defaultConfig()
	if db == nil {
		cfg.fail("New: db is nil: pass the *sql.DB of a PostgreSQL database")
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	if err := cfg.err(); err != nil {
		return nil, err
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	return &Outbox{db: db, cfg: cfg}, nil
}

// Table returns the outbox table's name as configured.
func (o *Outbox) Table() string { return o.cfg.table.Name }

func (o *Outbox) ddl() []string {
	t := o.cfg.table
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + t.Quoted + ` (
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
    last_error    text,
    claim         bigint,
    leased_until  timestamptz
) WITH (fillfactor = 50)`,
		// fillfactor: a claim rewrites its rows (claim, leased_until, no
		// indexed column), and with room left in the page PostgreSQL does
		// it as a heap-only update, without new index entries: about a
		// third less database time per row in EXPLAIN ANALYZE; at 50 the
		// claims of a freshly written page fit in it. The table is
		// transient (sent rows go after WithRetention), so its pages
		// being half empty costs little.
		// A table created before leases (amqpretry before issue 26) gains
		// the claim column: nullable, no default, so PostgreSQL only
		// updates its catalog; and the fillfactor, unless a DBA chose one
		// (it applies to the pages written from then on). The check keeps a Migrate at every start
		// from taking the table's ACCESS EXCLUSIVE lock when the column is
		// there, and lock_timeout keeps an ALTER that waits behind a long
		// transaction (an older relay's publish) from queueing every
		// Enqueue behind it: it fails instead, and Migrate can be run
		// again.
		`DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '` + t.Quoted + `'::regclass AND attname = 'claim' AND NOT attisdropped) THEN
        PERFORM set_config('lock_timeout', '5s', true);
        ALTER TABLE ` + t.Quoted + ` ADD COLUMN claim bigint;
        IF NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = '` + t.Quoted + `'::regclass AND reloptions::text LIKE '%fillfactor%') THEN
            ALTER TABLE ` + t.Quoted + ` SET (fillfactor = 50);
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '` + t.Quoted + `'::regclass AND attname = 'leased_until' AND NOT attisdropped) THEN
        PERFORM set_config('lock_timeout', '5s', true);
        ALTER TABLE ` + t.Quoted + ` ADD COLUMN leased_until timestamptz;
    END IF;
END $$`,
		// What a relay polls: in-flight rows in id order. Small, since rows
		// leave it when sent or failed.
		`CREATE INDEX IF NOT EXISTS ` + t.Index("pending_idx") + ` ON ` + t.Quoted + ` (id) WHERE status = 'in_flight'`,
		// What a relay polls when most in-flight rows wait out a backoff (a
		// destination down for an hour): the due ones, without reading the
		// others. A claim leaves next_retry_at as it is (the lease is
		// leased_until), so this index costs claims no heap-only update.
		`CREATE INDEX IF NOT EXISTS ` + t.Index("due_idx") + ` ON ` + t.Quoted + ` (next_retry_at) WHERE status = 'in_flight'`,
		// What the retention cleanup deletes.
		`CREATE INDEX IF NOT EXISTS ` + t.Index("sent_idx") + ` ON ` + t.Quoted + ` (sent_at) WHERE status = 'sent'`,
		// What a person lists and retries.
		`CREATE INDEX IF NOT EXISTS ` + t.Index("failed_idx") + ` ON ` + t.Quoted + ` (id) WHERE status = 'failed'`,
	}
}

// Schema returns the DDL Migrate runs, for a DBA to review or apply.
func (o *Outbox) Schema() string { return strings.Join(o.ddl(), ";\n\n") + ";\n" }

// Migrate creates the table and its indexes if they do not exist, and
// brings a table created by an earlier version up to date: it adds the
// claim column the relay's leases use (a catalog change; see Schema).
// Processes migrating at once are serialised by an advisory lock. Run it
// before starting relays of this version: they need the column, while
// relays of earlier versions still running work on, since they never read
// it.
//
// On a table that is up to date Migrate takes no lock on it, so running it
// at every start is safe while transactions write to it. Every lock it must
// take is waited for 5s at most. Adding the column takes the table's ACCESS
// EXCLUSIVE lock for an instant,
// and waits for transactions that use the table, such as an earlier
// relay's pass; after 5s of waiting it gives up with an error rather than
// hold every Enqueue queued behind it, and Migrate can be run again.
func (o *Outbox) Migrate(ctx context.Context) error {
	return pgsql.Migrate(ctx, o.db, o.cfg.table, o.ddl())
}

// Enqueue writes msg, to be published to exchange with routingKey, inside
// tx: the message exists if and only if tx commits. It returns the row's id.
//
// The published message's MessageId is msg.MessageId when set, else a random
// UUID chosen here and stored with the row, so every publish of the row, a
// re-send included, carries the same id for consumers to deduplicate on.
// Enqueue refuses, with ErrInvalidMessage, a message the publisher could
// never send or the broker would refuse: a property over 255 bytes, a header
// type AMQP has no field for, properties and headers that do not fit one
// frame (WithFrameMax), an Expiration that is not 0 to 315360000000
// milliseconds in decimal digits. Go int values in the headers become int64,
// as the publisher would make them. What only the relay's publisher can
// judge (a UserId other than its login) fails the row at its first publish.
func (o *Outbox) Enqueue(ctx context.Context, tx *sql.Tx, exchange, routingKey string, msg amqp.Publishing) (int64, error) {
	if tx == nil {
		return 0, fmt.Errorf("outbox: Enqueue needs the transaction of the business write, got nil")
	}
	if err := check(exchange, routingKey, &msg, o.cfg.frameMax); err != nil {
		return 0, err
	}
	props, err := encodeProperties(msg)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrInvalidMessage, err)
	}
	if msg.MessageId == "" {
		msg.MessageId = newUUID()
	}
	body := msg.Body
	if body == nil {
		body = []byte{}
	}
	var id int64
	err = tx.QueryRowContext(ctx, `INSERT INTO `+o.cfg.table.Quoted+
		` (message_id, exchange, routing_key, properties, body) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
		msg.MessageId, exchange, routingKey, props, body).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("outbox: enqueue into %s: %w", o.cfg.table.Name, pgsql.RedactErr(err))
	}
	return id, nil
}

// traceHeadroom is what check leaves in a frame for the trace context the
// publisher adds to the headers (traceparent, tracestate, baggage).
const traceHeadroom = 1024

func check(exchange, key string, msg *amqp.Publishing, frameMax int) error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w for exchange %q: %s", ErrInvalidMessage, exchange, fmt.Sprintf(format, args...))
	}
	if len(exchange) > amqptable.MaxShortString || len(key) > amqptable.MaxShortString {
		return invalid("exchange and routing key are limited to %d bytes, got %d and %d", amqptable.MaxShortString, len(exchange), len(key))
	}
	if err := amqptable.CheckShortStrings(*msg); err != nil {
		return invalid("%v", err)
	}
	if msg.Headers != nil {
		h, err := amqptable.Normalize(msg.Headers)
		if err != nil {
			return invalid("%v", err)
		}
		msg.Headers = h
	}
	if err := amqptable.CheckExpiration(msg.Expiration); err != nil {
		return invalid("%v", err)
	}
	size := amqptable.PropertiesSize(*msg)
	if msg.MessageId == "" {
		size += 1 + 36 // the UUID Enqueue picks
	}
	if limit := frameMax - amqptable.FrameOverhead - traceHeadroom; size > limit {
		return invalid("its properties and headers take %d bytes, more than the %d one frame holds (frame_max %d, less %d bytes for the trace context): make the headers smaller (or, for a broker with a larger frame_max, see WithFrameMax)",
			size, limit, frameMax, traceHeadroom)
	}
	return nil
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Redact hides the passwords in text: in postgres:// (or any scheme://)
// URLs and in password=... keyword/value pairs. Everything this package
// logs or returns has been through it; use it on a DSN before you print one.
func Redact(text string) string { return pgsql.Redact(text) }

// since is how long ago t was, for logs.
func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }
