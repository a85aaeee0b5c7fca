package outbox

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalidMessage: Enqueue refused the message because it could not be
	// published as it is (a header type AMQP has no field for, a property
	// over 255 bytes); nothing was written.
	ErrInvalidMessage = errors.New("outbox: invalid message")

	// ErrNotFound: no row has that id.
	ErrNotFound = errors.New("outbox: no such row")

	// ErrNotFailed: Retry was asked to requeue a row that is not failed.
	ErrNotFailed = errors.New("outbox: row is not failed")
)

// RowStateError says which row Retry could not requeue, or Get could not
// find, and why; it matches ErrNotFound or ErrNotFailed.
type RowStateError struct {
	ID     int64
	Status Status // "" when the row does not exist
}

func (e *RowStateError) Error() string {
	if e.Status == "" {
		return fmt.Sprintf("outbox: no row with id %d", e.ID)
	}
	return fmt.Sprintf("outbox: row %d is %s, not failed: only failed rows are retried by hand; the relay retries in-flight rows by itself", e.ID, e.Status)
}

func (e *RowStateError) Is(target error) bool {
	if e.Status == "" {
		return target == ErrNotFound
	}
	return target == ErrNotFailed
}
