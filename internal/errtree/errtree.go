package errtree

import "reflect"

// maxDepth bounds the walk, as a guard against an Unwrap that returns its
// own error: errors.As would recurse until the stack overflows.
const maxDepth = 10000

// As is errors.As for a target of type T: the first error in err's tree
// (err itself, then depth first through Unwrap() error and Unwrap() []error)
// that is a T, or whose As method sets a T, with the same order and the same
// rules. It does not allocate unless an As method is called.
func As[T any](err error) (T, bool) {
	return as[T](err, 0)
}

func as[T any](err error, depth int) (T, bool) {
	for ; err != nil && depth < maxDepth; depth++ {
		if t, ok := err.(T); ok {
			return t, true
		}
		if x, ok := err.(interface{ As(any) bool }); ok {
			var t T // declared here, so that only this branch pays for &t
			if x.As(&t) {
				return t, true
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if t, ok := as[T](e, depth+1); ok {
					return t, true
				}
			}
			var zero T
			return zero, false
		default:
			var zero T
			return zero, false
		}
	}
	var zero T
	return zero, false
}

// TypeName is fmt.Sprintf("%T", err) without fmt's allocations: the name of
// err's dynamic type, "<nil>" for nil.
func TypeName(err error) string {
	if err == nil {
		return "<nil>"
	}
	return reflect.TypeOf(err).String()
}
