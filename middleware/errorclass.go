package middleware

import (
	"errors"
	"fmt"

	"github.com/amqpretry/amqpretry/internal/errtree"
)

// ErrorClass is a named kind of failure: the errors that match a target with
// errors.Is (ErrorIs), that hold an error of a type (ErrorAs), or that a
// function of yours picks (ErrorFunc). RetryOn gives a class its own retry
// schedule and recoverer.ByError its own destination; the name is what the
// fault headers and the attempt spans report. Build one once and use it in
// both places:
//
//	timeouts := middleware.ErrorIs("timeout", context.DeadlineExceeded, ErrUpstreamTimeout)
//
// An ErrorClass is immutable and safe to share.
type ErrorClass struct {
	name  string
	match func(error) bool
}

// DefaultRule is the rule RuleApplied names for a failure that matches none
// of Retry's rules, and so got Retry's own schedule; no ErrorClass may take
// the name.
const DefaultRule = "default"

// ErrorIs returns the class of the errors that match any of targets with
// errors.Is, through every wrapping: Spring's retryable-exception map,
// MassTransit's Handle<T>. It panics when name is empty or reserved, or
// when targets is empty or holds nil.
func ErrorIs(name string, targets ...error) ErrorClass {
	var problems []string
	if len(targets) == 0 {
		problems = append(problems, "at least one target error")
	}
	for i, t := range targets {
		if t == nil {
			problems = append(problems, fmt.Sprintf("non-nil target errors, got nil at index %d", i))
		}
	}
	checkClass("ErrorIs", name, problems...)
	targets = append([]error(nil), targets...) // the caller may reuse its slice
	return ErrorClass{name: name, match: func(err error) bool {
		for _, t := range targets {
			if errors.Is(err, t) {
				return true
			}
		}
		return false
	}}
}

// ErrorAs returns the class of the errors that hold an E, as errors.As finds
// it: a type of your own (*RateLimitedError), a library's (*pgconn.PgError),
// or an interface (interface{ error; Timeout() bool }). To match on a field
// of it, use ErrorFunc. It panics when name is empty or reserved.
func ErrorAs[E error](name string) ErrorClass {
	checkClass("ErrorAs", name)
	return ErrorClass{name: name, match: func(err error) bool {
		_, ok := errtree.As[E](err)
		return ok
	}}
}

// ErrorFunc returns the class of the errors for which match returns true. It
// panics when name is empty or reserved, or match is nil.
//
//	rateLimited := middleware.ErrorFunc("rate-limited", func(err error) bool {
//		var h *HTTPError
//		return errors.As(err, &h) && h.Status == http.StatusTooManyRequests
//	})
func ErrorFunc(name string, match func(error) bool) ErrorClass {
	var problems []string
	if match == nil {
		problems = append(problems, "a non-nil function")
	}
	checkClass("ErrorFunc", name, problems...)
	return ErrorClass{name: name, match: match}
}

// Name is the class's name.
func (c ErrorClass) Name() string { return c.name }

// Matches reports whether err belongs to the class. A nil error, and any
// error for the zero ErrorClass, belong to none. A match that panics (an Is
// or Unwrap method of the error's, or the function given to ErrorFunc) does
// not match.
func (c ErrorClass) Matches(err error) (ok bool) {
	if err == nil || c.match == nil {
		return false
	}
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return c.match(err)
}

// valid reports whether c was built by ErrorIs, ErrorAs or ErrorFunc.
func (c ErrorClass) valid() bool { return c.match != nil }

// checkClass panics naming every problem of a class being built by ctor.
func checkClass(ctor, name string, problems ...string) {
	switch name {
	case "":
		problems = append([]string{"a name (the fault headers and spans report it)"}, problems...)
	case DefaultRule:
		problems = append([]string{fmt.Sprintf("a name other than %q (Retry's own schedule is called so)", DefaultRule)}, problems...)
	}
	if len(problems) == 0 {
		return
	}
	msg := ""
	for i, p := range problems {
		if i > 0 {
			msg += "\n"
		}
		msg += fmt.Sprintf("middleware: %s(%q) expects %s", ctor, name, p)
	}
	panic(msg)
}
