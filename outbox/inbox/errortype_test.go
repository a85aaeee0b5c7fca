package inbox_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/outbox/inbox"
)

// A failed commit groups by what the database said, not by the inbox's
// wrapper: the error type in the fault headers and telemetry is the
// driver's error under the CommitError.
func TestCommitErrorTypeIsTheDatabasesError(t *testing.T) {
	err := fmt.Errorf("handle order: %w", &inbox.CommitError{Consumer: "shipping", MessageID: "m-1", Err: &pgconn.PgError{Code: "40001"}})
	if got := chainrun.ErrorType(err); got != "*pgconn.PgError" {
		t.Errorf("ErrorType = %q, want *pgconn.PgError", got)
	}
}
