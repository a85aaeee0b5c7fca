package inbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/outbox/internal/pgsql"
)

// DefaultTable is the table New uses without WithTable.
const DefaultTable = "amqpretry_inbox"

var (
	// ErrNoMessageID: the delivery has no MessageId (or the key function
	// returned ""), so it cannot be deduplicated. The handler returns it
	// marked Permanent: retrying cannot give the message an id.
	ErrNoMessageID = errors.New("inbox: delivery has no message id")

	// ErrNoConsumerName: neither WithConsumerName nor the listener's queue
	// names the consumer. Returned as an ordinary error, so the message is
	// requeued rather than lost while the configuration is fixed.
	ErrNoConsumerName = errors.New("inbox: no consumer name")
)

// CommitError: the transaction holding the handler's writes and the message
// id did not commit. It is an ordinary, retryable error: if the commit did
// happen after all, the redelivery is recognised and skipped.
type CommitError struct {
	Consumer, MessageID string
	Err                 error
}

func (e *CommitError) Error() string {
	return fmt.Sprintf("inbox: commit of message %q for consumer %q failed, the message will be processed again: %v", e.MessageID, e.Consumer, e.Err)
}

func (e *CommitError) Unwrap() error { return e.Err }

// Inbox records processed message ids. It is safe for concurrent use.
type Inbox struct {
	db       *sql.DB
	table    pgsql.Table
	consumer string
	key      func(*amqp.Delivery) (string, error)
	logger   *slog.Logger
}

// Option configures an Inbox.
type Option func(*config)

type config struct {
	table    pgsql.Table
	consumer string
	key      func(*amqp.Delivery) (string, error)
	logger   *slog.Logger
	errs     []error
}

func (c *config) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("inbox: "+format, args...))
}

// WithTable names the processed-messages table, optionally schema-qualified:
// lowercase letters, digits and _. Default DefaultTable.
func WithTable(name string) Option {
	return func(c *config) {
		t, err := pgsql.ParseTable(name)
		if err != nil {
			c.fail("WithTable: %v", err)
			return
		}
		c.table = t
	}
}

// WithConsumerName names the consumer whose processed ids are recorded: two
// consumers of the same message (two queues bound to one exchange) each
// process it once. Default: the queue the listener consumes from
// (chainrun.Queue). Set it when one handler serves several queues that
// must share one record, or when the handler runs outside a listener.
func WithConsumerName(name string) Option {
	return func(c *config) {
		if name == "" || len(name) > 255 || !storable(name) {
			c.fail("WithConsumerName(%q): want 1 to 255 bytes of UTF-8 without NUL", name)
			return
		}
		c.consumer = name
	}
}

// WithKey derives the deduplication key from a delivery, for producers that
// do not set MessageId (a business id in a header, say). Default: the
// delivery's MessageId. An error from key is returned as it is (mark it
// Permanent if retrying cannot help); an empty key is ErrNoMessageID. A key
// over 2 KiB is recorded by its SHA-256, since PostgreSQL cannot index one
// much longer.
func WithKey(key func(*amqp.Delivery) (string, error)) Option {
	return func(c *config) {
		if key == nil {
			c.fail("WithKey(nil): pass a function, or leave the option out to use MessageId")
			return
		}
		c.key = key
	}
}

// WithLogger sets the logger. Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.fail("WithLogger(nil): pass a logger, or leave the option out for slog.Default()")
			return
		}
		c.logger = l
	}
}

// New returns an Inbox on db, checking every option. It does not touch the
// database: call Migrate to create the table.
func New(db *sql.DB, opts ...Option) (*Inbox, error) {
	t, _ := pgsql.ParseTable(DefaultTable)
	cfg := config{table: t}
	if db == nil {
		cfg.fail("New: db is nil: pass the *sql.DB of a PostgreSQL database")
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	if len(cfg.errs) > 0 {
		return nil, errors.Join(cfg.errs...)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	return &Inbox{db: db, table: cfg.table, consumer: cfg.consumer, key: cfg.key, logger: cfg.logger}, nil
}

func (ib *Inbox) ddl() []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + ib.table.Quoted + ` (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
)`,
		// What Purge deletes.
		`CREATE INDEX IF NOT EXISTS ` + ib.table.Index("processed_idx") + ` ON ` + ib.table.Quoted + ` (processed_at)`,
	}
}

// Schema returns the DDL Migrate runs, for a DBA to review or apply.
func (ib *Inbox) Schema() string {
	s := ""
	for _, stmt := range ib.ddl() {
		s += stmt + ";\n\n"
	}
	return s[:len(s)-1]
}

// Migrate creates the table and its index if they do not exist. On a table
// that is up to date it takes no lock on it, so running it at every start is
// safe while handlers run; a lock it must take (to create a missing index)
// is waited for 5s at most, then Migrate fails and can be run again.
func (ib *Inbox) Migrate(ctx context.Context) error {
	return pgsql.Migrate(ctx, ib.db, ib.table, ib.ddl())
}

// HandlerFunc processes a delivery inside tx, the transaction that records
// its id. Write the message's effects through tx; do not commit or roll it
// back, the inbox does.
type HandlerFunc func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error

// Handler returns a middleware.Handler that runs fn at most once per
// message id and consumer: in one transaction it records the id, runs fn
// and commits. A message already recorded returns nil without running fn,
// so the listener acks it. fn's error, or a panic, rolls everything back,
// the id included, and goes up the chain to be retried or recovered.
func (ib *Inbox) Handler(fn HandlerFunc) middleware.Handler {
	if fn == nil {
		panic("amqpretry/outbox/inbox: Handler expects a non-nil function")
	}
	return func(ctx context.Context, d *amqp.Delivery) (err error) {
		id, err := ib.messageID(d)
		if err != nil {
			return err
		}
		consumer := ib.consumer
		if consumer == "" {
			consumer = chainrun.Queue(ctx)
		}
		if consumer == "" {
			return fmt.Errorf("%w: the handler runs outside a listener, so name the consumer with WithConsumerName", ErrNoConsumerName)
		}
		tx, err := ib.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("inbox: begin a transaction for message %q: %w", shown(id), pgsql.RedactErr(err))
		}
		// Rolls back on an error, on a panic in fn (which then goes on up),
		// and after a duplicate; after Commit it does nothing.
		defer func() { _ = tx.Rollback() }()

		// A concurrent transaction recording the same id makes this insert
		// wait for it: if it commits, this one inserts nothing and skips.
		res, err := tx.ExecContext(ctx, `INSERT INTO `+ib.table.Quoted+` (consumer, message_id, processed_at)
		VALUES ($1, $2, now()) ON CONFLICT DO NOTHING`, storedKey(consumer), storedKey(id))
		if err != nil {
			return fmt.Errorf("inbox: record message %q for consumer %q: %w", shown(id), consumer, pgsql.RedactErr(err))
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("inbox: record message %q for consumer %q: %w", shown(id), consumer, pgsql.RedactErr(err))
		}
		if n == 0 {
			ib.logger.DebugContext(ctx, "inbox: message already processed; skipped", "consumer", consumer, "message_id", shown(id), "redelivered", d.Redelivered)
			return nil
		}
		if err := fn(ctx, tx, d); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return &CommitError{Consumer: consumer, MessageID: id, Err: pgsql.RedactErr(err)}
		}
		return nil
	}
}

func (ib *Inbox) messageID(d *amqp.Delivery) (string, error) {
	if ib.key == nil {
		if d.MessageId == "" {
			return "", middleware.Permanent(fmt.Errorf("%w (exchange %q, routing key %q): publish with MessageId set, as the outbox does, or pass inbox.WithKey to derive the key from the message",
				ErrNoMessageID, d.Exchange, d.RoutingKey))
		}
		return d.MessageId, nil
	}
	id, err := ib.key(d)
	if err != nil {
		return "", fmt.Errorf("inbox: the key function failed: %w", err)
	}
	if id == "" {
		return "", middleware.Permanent(fmt.Errorf("%w: the key function returned \"\" (exchange %q, routing key %q)", ErrNoMessageID, d.Exchange, d.RoutingKey))
	}
	return id, nil
}

// escapedPrefix starts the stored form of a key that PostgreSQL's text
// cannot hold as it is. No key is stored verbatim with this prefix, so the
// two forms never collide.
const escapedPrefix = "amqpretry-hex:"

// storable reports whether text can hold s: valid UTF-8 without NUL.
func storable(s string) bool { return utf8.ValidString(s) && !strings.Contains(s, "\x00") }

// storedKey is the form of key recorded in the table: the key itself, or,
// for a key text cannot hold (a NUL byte, bytes that are not UTF-8, which
// AMQP allows in a message id) or one that starts with escapedPrefix, the
// prefix and the key's bytes in hex. It is one-to-one, so such a message is
// deduplicated like any other instead of failing its insert on every
// delivery. The consumer's name is stored the same way: WithConsumerName
// refuses a name text cannot hold, but a queue's name comes from the broker.
//
// A key whose stored form is longer than maxStoredKey is stored as the prefix, "sha256:" and its
// SHA-256 in hex: PostgreSQL refuses a btree entry over about 2.7 KB, so such
// a key's insert would fail on every delivery. Neither other form can start
// that way (hex digits follow the prefix; a verbatim key never starts with
// it), so a hashed key collides with no other.
func storedKey(key string) string {
	stored := key
	if !storable(key) || strings.HasPrefix(key, escapedPrefix) {
		stored = escapedPrefix + hex.EncodeToString([]byte(key))
	}
	if len(stored) > maxStoredKey {
		sum := sha256.Sum256([]byte(key))
		return escapedPrefix + "sha256:" + hex.EncodeToString(sum[:])
	}
	return stored
}

// maxStoredKey is the longest stored form of a key that is not hashed: with
// a consumer name of up to 255 bytes (a queue's), escaped at worst, the
// primary key's entry stays under PostgreSQL's btree limit (2704 bytes).
const maxStoredKey = 2048

// shown is key as errors and logs quote it: bounded.
func shown(key string) string {
	const most = 200
	if len(key) <= most {
		return key
	}
	return key[:most] + "…"
}

// Purge deletes the records of messages processed more than olderThan ago,
// in bounded batches, and returns how many. Deduplication covers only what
// is recorded: a duplicate arriving after its record is purged is processed
// again, so keep records longer than any redelivery can take (the outbox's
// retry schedule, a DLQ replay).
func (ib *Inbox) Purge(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("inbox: Purge(%v): want a duration of 0 or more", olderThan)
	}
	const batch = 1000
	var total int64
	for {
		res, err := ib.db.ExecContext(ctx, `DELETE FROM `+ib.table.Quoted+` WHERE (consumer, message_id) IN (
		SELECT consumer, message_id FROM `+ib.table.Quoted+` WHERE processed_at < now() - $1::bigint * interval '1 microsecond' LIMIT $2)`,
			olderThan.Microseconds(), batch)
		if err != nil {
			return total, fmt.Errorf("inbox: purge %s: %w", ib.table.Name, pgsql.RedactErr(err))
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("inbox: purge %s: %w", ib.table.Name, pgsql.RedactErr(err))
		}
		total += n
		if n < batch {
			return total, nil
		}
	}
}
