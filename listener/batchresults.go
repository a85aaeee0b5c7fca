package listener

import (
	"errors"
	"fmt"
)

// ErrBatchResults is the error the messages of a batch fail with when its
// BatchHandler returned PerMessage with a slice of another length than the
// batch's: the listener cannot tell which result is whose.
var ErrBatchResults = errors.New("listener: the batch handler's results do not match its batch")

// MessageErrors is what PerMessage returns: the result of each message of a
// batch, Errs[i] for batch[i], nil for a success.
type MessageErrors struct {
	Errs []error
}

// PerMessage reports a batch's results one message at a time: errs[i] is
// the result of batch[i] as the slice holds it when the handler returns
// (sorted in place, if the handler sorted it), nil for a success, and errs
// must be as long as the batch. It always returns a non-nil *MessageErrors, even when every
// result is nil (then every message is acked): the listener checks the
// length before it reads any result.
func PerMessage(errs []error) error { return &MessageErrors{Errs: errs} }

func (e *MessageErrors) Error() string {
	failed, first := 0, -1
	for i, err := range e.Errs {
		if err != nil {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if failed == 0 {
		return fmt.Sprintf("listener: none of the %d messages of the batch failed", len(e.Errs))
	}
	return fmt.Sprintf("listener: %d of the %d messages of the batch failed; the first, message %d: %s",
		failed, len(e.Errs), first, errorString(e.Errs[first]))
}

// errorString is err.Error(), or a stand-in when that panics (a typed nil).
func errorString(err error) (s string) {
	defer func() {
		if v := recover(); v != nil {
			s = fmt.Sprintf("%T (its Error method panicked: %v)", err, v)
		}
	}()
	return err.Error()
}

// batchResults reads what a handler returned for a batch of n: the result
// of the i-th message.
func batchResults(err error, n int) func(i int) error {
	if err == nil {
		return func(int) error { return nil }
	}
	me, ok := asMessageErrors(err)
	switch {
	case !ok:
		return func(int) error { return err }
	case len(me.Errs) != n:
		wrong := fmt.Errorf("%w: PerMessage got %d results for a batch of %d (one per delivery, nil for a success, in the batch's order)",
			ErrBatchResults, len(me.Errs), n)
		return func(int) error { return wrong }
	}
	return func(i int) error { return me.Errs[i] }
}

// asMessageErrors finds PerMessage's results in err. An error whose As or
// Unwrap method panics is taken as it is: a failure of the whole batch
// (CatchPanics in each message's chain makes it a *middleware.PanicError).
func asMessageErrors(err error) (me *MessageErrors, ok bool) {
	defer func() {
		if recover() != nil {
			me, ok = nil, false
		}
	}()
	ok = errors.As(err, &me) && me != nil
	return me, ok
}
