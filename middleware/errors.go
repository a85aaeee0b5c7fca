package middleware

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"unicode/utf8"

	"github.com/amqpretry/amqpretry/internal/chainerr"
	"github.com/amqpretry/amqpretry/internal/errtree"

	"github.com/cenkalti/backoff/v4"
)

// Sentinels matched with errors.Is. Each has a typed error that carries the
// details and unwraps to the underlying cause.
var (
	// ErrRetriesExhausted: every attempt Retry was allowed to make failed, or
	// its time limit left no room for another. See RetriesExhaustedError.
	ErrRetriesExhausted = errors.New("middleware: retries exhausted")

	// ErrInterrupted: processing stopped because the delivery's context ended
	// or the listener began shutting down, not because the message is bad. The
	// listener requeues it and Recover never recovers it. See InterruptedError.
	ErrInterrupted = errors.New("middleware: processing interrupted")

	// ErrRecoveryFailed: the Recoverer could not put the message somewhere safe,
	// so it must stay on its queue. See RecoveryError.
	ErrRecoveryFailed = errors.New("middleware: recovery failed")

	// ErrReject is returned by a Recoverer (recoverer.Reject) that wants the
	// message rejected without requeue, so that the queue's own dead-letter
	// exchange takes it. A queue without one drops it.
	ErrReject = errors.New("middleware: reject without requeue")

	// ErrRedeliver is returned by a Recoverer that hands the message back to
	// the broker to be delivered again later: the listener returns it at once
	// with basic.reject(requeue=true), which counts toward the queue's
	// delivery limit, and adds no requeue delay of its own, since the queue
	// delays it (dlx.Topology's DelayedRedelivery, RabbitMQ 4.3's delayed
	// retry).
	ErrRedeliver = errors.New("middleware: redeliver through the broker")
)

// PermanentError marks an error that retrying cannot fix.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as not worth retrying: Retry stops at once, Recover
// recovers it, and without a recoverer the listener rejects the message
// without requeueing it. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err, or any error it wraps, was marked by
// Permanent or by backoff.Permanent.
func IsPermanent(err error) bool {
	if _, ok := errtree.As[*PermanentError](err); ok {
		return true
	}
	_, ok := errtree.As[*backoff.PermanentError](err)
	return ok
}

// RetriesExhaustedError is returned by Retry when no further attempt is
// allowed. It matches ErrRetriesExhausted and unwraps to the last attempt's
// error.
type RetriesExhaustedError struct {
	Attempts int   // attempts made, the first call included
	Last     error // the last attempt's error
	// TimeLimited is true when the time limit (WithMaxElapsedTime), not the
	// attempt count, stopped the retries.
	TimeLimited bool
	// HandedOff is true when HandOffAfter stopped the local retries because
	// the next wait was too long to hold in memory.
	HandedOff bool
	// Rule names the rule of Retry that applied to the last error (see
	// RetryOn): a class's name, or "default"; "" when Retry has no rules.
	Rule string
}

func (e *RetriesExhaustedError) Error() string {
	why := ""
	if e.Rule != "" {
		why = fmt.Sprintf(" under rule %q", e.Rule)
	}
	switch {
	case e.TimeLimited:
		why += " (time limit reached)"
	case e.HandedOff:
		why += " (the next wait is past HandOffAfter: handed to the recoverer)"
	}
	return fmt.Sprintf("middleware: retries exhausted after %d attempt%s%s: %v", e.Attempts, plural(e.Attempts), why, e.Last)
}

func (e *RetriesExhaustedError) Is(target error) bool { return target == ErrRetriesExhausted }
func (e *RetriesExhaustedError) Unwrap() error        { return e.Last }

// InterruptedError reports that processing stopped for a reason outside the
// message: the context ended or the listener began shutting down. It matches
// ErrInterrupted and unwraps to both the reason (context.Canceled,
// context.DeadlineExceeded or ErrInterrupted) and the last attempt's error.
type InterruptedError struct {
	Attempt int   // the attempt that had just failed, or 0 if unknown
	Reason  error // why processing stopped
	Last    error // the error of that attempt, if any
}

func (e *InterruptedError) Error() string {
	msg := fmt.Sprintf("middleware: interrupted (%v)", e.Reason)
	if e.Attempt > 0 {
		msg += fmt.Sprintf(" after attempt %d", e.Attempt)
	}
	if e.Last != nil {
		msg += fmt.Sprintf(": %v", e.Last)
	}
	return msg + "; the message will be requeued"
}

func (e *InterruptedError) Is(target error) bool { return target == ErrInterrupted }
func (e *InterruptedError) Unwrap() []error {
	if e.Last == nil {
		return []error{e.Reason}
	}
	return []error{e.Reason, e.Last}
}

// RecoveryError reports that the Recoverer failed, so the message is not safely
// anywhere else and must stay on its queue. It matches ErrRecoveryFailed and
// unwraps to both the recoverer's error and the handler's.
type RecoveryError struct {
	Err   error // why the recoverer failed
	Cause error // the handler error it was recovering
}

func (e *RecoveryError) Error() string {
	return fmt.Sprintf("middleware: recovery failed: %v (recovering from: %v); the message will be requeued", e.Err, e.Cause)
}

func (e *RecoveryError) Is(target error) bool { return target == ErrRecoveryFailed }
func (e *RecoveryError) Unwrap() []error      { return []error{e.Err, e.Cause} }

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// middleware/chainrun exports these; they live here because they read this
// package's unexported error types and this package uses them itself.
func init() {
	chainerr.HandlerError, chainerr.ErrorType, chainerr.AttemptsMade = handlerError, errorType, attemptsMade
}

// handlerError strips the library's own wrappers (retries exhausted, Retry's
// early stop, Permanent, backoff.Permanent) to reach the error the handler
// returned, with the handler's own wrapping intact (chainrun.HandlerError).
func handlerError(err error) error {
	for {
		switch e := err.(type) {
		case *RetriesExhaustedError:
			err = e.Last
		case *stoppedError:
			err = e.err
		case *PermanentError:
			err = e.Err
		case *backoff.PermanentError:
			err = e.Err
		default:
			return err
		}
	}
}

// errorType names an error's cause for telemetry and fault headers; the
// rules are chainrun.ErrorType's doc.
func errorType(err error) (name string) {
	defer func() {
		if recover() != nil { // an As or Unwrap method of the user's panicked
			name = errtree.TypeName(err)
		}
	}()
	err = handlerError(err)
	if _, ok := errtree.As[*PanicError](err); ok {
		return "panic"
	}
	leaf, wrapped := innermost(err)
	name = errtree.TypeName(leaf)
	if name != "*errors.errorString" { // (a pointer: a map key that cannot panic)
		return name
	}
	if known, ok := wellKnownSentinels[leaf]; ok {
		return known
	}
	if wrapped {
		return fmt.Sprintf("errors.New(%q)", cutText(leaf.Error(), 64))
	}
	return name
}

// innermost follows Unwrap (the first non-nil of several) to the end of the
// chain, and says whether it moved at all.
func innermost(err error) (leaf error, wrapped bool) {
	for depth := 0; depth < 64; depth++ {
		var next error
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			next = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if e != nil {
					next = e
					break
				}
			}
		}
		if next == nil {
			return err, depth > 0
		}
		err = next
	}
	return err, true
}

// wellKnownSentinels names the standard library's sentinel errors that are
// made by errors.New.
var wellKnownSentinels = map[error]string{
	io.EOF:              "io.EOF",
	io.ErrUnexpectedEOF: "io.ErrUnexpectedEOF",
	io.ErrClosedPipe:    "io.ErrClosedPipe",
	io.ErrShortWrite:    "io.ErrShortWrite",
	context.Canceled:    "context.Canceled",
	os.ErrNotExist:      "fs.ErrNotExist",
	os.ErrExist:         "fs.ErrExist",
	os.ErrPermission:    "fs.ErrPermission",
	os.ErrClosed:        "fs.ErrClosed",
}

// cutText shortens s to at most n bytes on a rune boundary.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
