// Package chainerr hands middleware/chainrun the error helpers that package
// middleware implements and uses itself (for telemetry and fault events):
// they read middleware's unexported error types, and chainrun, which
// imports middleware, cannot be imported by it. middleware sets them in its
// init; any importer of chainrun has run that init first.
package chainerr

var (
	// HandlerError strips the library's wrappers from a chain's error.
	HandlerError func(err error) error
	// ErrorType names an error's cause for telemetry and fault headers.
	ErrorType func(err error) string
	// AttemptsMade reads the attempt count a Retry left on its error.
	AttemptsMade func(err error) (int, bool)
)
