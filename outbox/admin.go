package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/amqpretry/amqpretry/outbox/internal/pgsql"
)

// Row is what List shows of an outbox row: everything but the message's
// properties and body.
type Row struct {
	ID           int64
	MessageID    string
	Exchange     string
	RoutingKey   string
	Status       Status
	RetriedCount int       // failed publishes so far
	NextRetryAt  time.Time // when an in-flight row is due, or its relay's lease ends
	CreatedAt    time.Time
	SentAt       time.Time // zero unless sent
	LastError    string    // why the latest publish failed; "" if none did
	BodySize     int
}

// ListOptions selects the rows List returns.
type ListOptions struct {
	Failed bool // only failed rows; otherwise rows of every status
	Limit  int  // at most this many, oldest first; 0 means 100
}

// List returns rows in id order (the order of creation).
func (o *Outbox) List(ctx context.Context, opt ListOptions) ([]Row, error) {
	limit := opt.Limit
	if limit <= 0 {
		limit = 100
	}
	where := ""
	if opt.Failed {
		where = ` WHERE status = 'failed'`
	}
	rows, err := o.db.QueryContext(ctx, rowColumns+o.cfg.table.Quoted+where+` ORDER BY id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list %s: %w", o.cfg.table.Name, pgsql.RedactErr(err))
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, fmt.Errorf("outbox: list %s: %w", o.cfg.table.Name, pgsql.RedactErr(err))
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: list %s: %w", o.cfg.table.Name, pgsql.RedactErr(err))
	}
	return out, nil
}

// Get returns the row with this id, as List shows it. A missing row gives
// a *RowStateError matching ErrNotFound.
func (o *Outbox) Get(ctx context.Context, id int64) (Row, error) {
	r, err := scanRow(o.db.QueryRowContext(ctx, rowColumns+o.cfg.table.Quoted+` WHERE id = $1`, id))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Row{}, &RowStateError{ID: id}
	case err != nil:
		return Row{}, fmt.Errorf("outbox: get row %d of %s: %w", id, o.cfg.table.Name, pgsql.RedactErr(err))
	}
	return r, nil
}

// rowColumns selects what a Row holds, followed by the table's name.
const rowColumns = `SELECT id, message_id, exchange, routing_key, status, retried_count,
	next_retry_at, created_at, sent_at, COALESCE(last_error, ''), octet_length(body) FROM `

// scanRow reads the columns of rowColumns from a *sql.Rows or a *sql.Row.
func scanRow(s interface{ Scan(...any) error }) (Row, error) {
	var r Row
	var sent sql.NullTime
	if err := s.Scan(&r.ID, &r.MessageID, &r.Exchange, &r.RoutingKey, &r.Status, &r.RetriedCount,
		&r.NextRetryAt, &r.CreatedAt, &sent, &r.LastError, &r.BodySize); err != nil {
		return Row{}, err
	}
	r.SentAt = sent.Time
	return r, nil
}

// requeue is what Retry does to a failed row: due now, with a fresh count
// of tries; last_error stays until a publish succeeds, as a record.
const requeue = `SET status = 'in_flight', next_retry_at = now(), retried_count = 0 WHERE status = 'failed'`

// Retry puts a failed row back in flight, due at once, with its tries
// counted from zero: call it once the cause (a missing exchange or binding)
// is fixed. A row that is not failed gives a *RowStateError matching
// ErrNotFailed, a missing one ErrNotFound.
func (o *Outbox) Retry(ctx context.Context, id int64) error {
	res, err := o.db.ExecContext(ctx, `UPDATE `+o.cfg.table.Quoted+` `+requeue+` AND id = $1`, id)
	if err != nil {
		return fmt.Errorf("outbox: retry row %d: %w", id, pgsql.RedactErr(err))
	}
	if n, err := res.RowsAffected(); err == nil && n == 1 {
		return nil
	}
	var status Status
	err = o.db.QueryRowContext(ctx, `SELECT status FROM `+o.cfg.table.Quoted+` WHERE id = $1`, id).Scan(&status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return &RowStateError{ID: id}
	case err != nil:
		return fmt.Errorf("outbox: retry row %d: %w", id, pgsql.RedactErr(err))
	case status == StatusFailed:
		// Failed again between the two statements: a relay cannot do that
		// (it never touches failed rows), so someone else is editing it.
		return fmt.Errorf("outbox: row %d changed while it was being retried; try again", id)
	}
	return &RowStateError{ID: id, Status: status}
}

// RetryAllFailed puts every failed row back in flight, as Retry does, and
// returns how many.
func (o *Outbox) RetryAllFailed(ctx context.Context) (int, error) {
	res, err := o.db.ExecContext(ctx, `UPDATE `+o.cfg.table.Quoted+` `+requeue)
	if err != nil {
		return 0, fmt.Errorf("outbox: retry failed rows: %w", pgsql.RedactErr(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("outbox: retry failed rows: %w", pgsql.RedactErr(err))
	}
	return int(n), nil
}

// Counts returns how many rows are in each status, for a summary (a row
// count per status, no other state).
func (o *Outbox) Counts(ctx context.Context) (map[Status]int64, error) {
	rows, err := o.db.QueryContext(ctx, `SELECT status, count(*) FROM `+o.cfg.table.Quoted+` GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("outbox: count %s: %w", o.cfg.table.Name, pgsql.RedactErr(err))
	}
	defer rows.Close()
	out := map[Status]int64{StatusInFlight: 0, StatusSent: 0, StatusFailed: 0}
	for rows.Next() {
		var s Status
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("outbox: count %s: %w", o.cfg.table.Name, pgsql.RedactErr(err))
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: count %s: %w", o.cfg.table.Name, pgsql.RedactErr(err))
	}
	return out, nil
}
