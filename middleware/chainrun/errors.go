package chainrun

import (
	"github.com/amqpretry/amqpretry/internal/chainerr"
	_ "github.com/amqpretry/amqpretry/middleware" // sets chainerr's functions
)

// HandlerError strips the library's own wrappers (retries exhausted, Retry's
// early stop, middleware.Permanent, backoff.Permanent) to reach the error the
// handler returned, with the handler's own wrapping intact.
func HandlerError(err error) error { return chainerr.HandlerError(err) }

// ErrorType names an error for telemetry (error.type) and fault headers
// (x-amqpretry-error-type), for grouping failures by cause: "panic" for a
// handler panic; otherwise the Go type of the innermost error of the
// handler's error (HandlerError), reached through every Unwrap (the first of
// several, as with errors.Join or fmt.Errorf with two %w): wrappers that add
// context (fmt.Errorf's %w, errors.Join, a *url.Error, inbox.CommitError)
// give way to the cause, *json.SyntaxError or *pgconn.PgError. An innermost
// error made by errors.New, reached through a wrapper, is a sentinel and is
// named by its value: io.EOF and a few other well-known ones by their Go
// names, others as errors.New("its text") (its first 64 bytes); one returned
// as it is stays *errors.errorString (its text may be anything: the fault
// header x-exception-message has it). The whole chain stays in the message.
func ErrorType(err error) string { return chainerr.ErrorType(err) }

// AttemptsMade reports how many attempts the Retry that returned err made,
// when err came out of a middleware.Retry (exhausted, or stopped by a
// Permanent error or RetryIf). A recoverer outside the Retry reads the count
// here; inside it, middleware.Attempt(ctx) gives it. An error that knows its
// count from elsewhere says so with an AttemptsMade() int method
// (listener.RedeliveryLimitError: the deliveries that ended unsettled).
func AttemptsMade(err error) (int, bool) { return chainerr.AttemptsMade(err) }
