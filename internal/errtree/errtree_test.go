package errtree_test

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/amqpretry/amqpretry/internal/errtree"
)

type codeError struct{ code int }

func (e *codeError) Error() string { return fmt.Sprint("code ", e.code) }

// asCode answers As for a *codeError without being one.
type asCode struct{ code int }

func (a asCode) Error() string { return "as code" }
func (a asCode) As(target any) bool {
	if p, ok := target.(**codeError); ok {
		*p = &codeError{a.code}
		return true
	}
	return false
}

type multi []error

func (m multi) Error() string   { return "multi" }
func (m multi) Unwrap() []error { return m }

type coder interface{ Code() int }

func (e *codeError) Code() int { return e.code }

// TestAsAgreesWithErrors compares As with errors.As over trees that use
// every rule: the error itself, Unwrap() error, Unwrap() []error depth
// first, an As method, interface targets, and nothing found.
func TestAsAgreesWithErrors(t *testing.T) {
	first, second := &codeError{1}, &codeError{2}
	trees := []struct {
		name string
		err  error
	}{
		{"nil", nil},
		{"itself", first},
		{"wrapped twice", fmt.Errorf("a: %w", fmt.Errorf("b: %w", first))},
		{"joined, first of two wins", errors.Join(errors.New("x"), fmt.Errorf("y: %w", first), second)},
		{"depth first", multi{multi{errors.New("deep"), first}, second}},
		{"through an As method", fmt.Errorf("w: %w", asCode{7})},
		{"As method before the wrapped one", multi{asCode{8}, first}},
		{"not there", fmt.Errorf("w: %w", errors.Join(errors.New("a"), fs.ErrNotExist))},
		{"typed nil", (*codeError)(nil)},
	}
	for _, tt := range trees {
		t.Run(tt.name, func(t *testing.T) {
			var want *codeError
			wantOK := errors.As(tt.err, &want)
			got, ok := errtree.As[*codeError](tt.err)
			if ok != wantOK || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("As[*codeError] = %v, %v; errors.As gives %v, %v", got, ok, want, wantOK)
			}
			var wantI coder
			wantIOK := errors.As(tt.err, &wantI)
			gotI, okI := errtree.As[coder](tt.err)
			if okI != wantIOK || fmt.Sprint(gotI) != fmt.Sprint(wantI) {
				t.Errorf("As[coder] = %v, %v; errors.As gives %v, %v", gotI, okI, wantI, wantIOK)
			}
		})
	}
}

// selfWrapping unwraps to itself: errors.As would never return.
type selfWrapping struct{}

func (s *selfWrapping) Error() string { return "loop" }
func (s *selfWrapping) Unwrap() error { return s }

func TestAsEndsOnACycle(t *testing.T) {
	if _, ok := errtree.As[*codeError](&selfWrapping{}); ok {
		t.Fatal("found a *codeError in a tree without one")
	}
}

func TestAsDoesNotAllocate(t *testing.T) {
	err := fmt.Errorf("outer: %w", errors.Join(errors.New("a"), fmt.Errorf("b: %w", &codeError{3})))
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := errtree.As[*codeError](err); !ok {
			t.Fatal("not found")
		}
		if _, ok := errtree.As[interface{ Timeout() bool }](err); ok {
			t.Fatal("found what is not there")
		}
	})
	if allocs != 0 {
		t.Errorf("As allocated %v times per run, want 0", allocs)
	}
}

func TestTypeNameIsPercentT(t *testing.T) {
	for _, err := range []error{nil, errors.New("x"), &codeError{1}, asCode{1}, multi{}, fmt.Errorf("w: %w", fs.ErrClosed)} {
		if got, want := errtree.TypeName(err), fmt.Sprintf("%T", err); got != want {
			t.Errorf("TypeName(%#v) = %q, want %q", err, got, want)
		}
	}
}

func FuzzAsAgreesWithErrors(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3})
	f.Fuzz(func(t *testing.T, shape []byte) {
		err := build(shape)
		var want *codeError
		wantOK := errors.As(err, &want)
		got, ok := errtree.As[*codeError](err)
		if ok != wantOK || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("As = %v, %v; errors.As = %v, %v", got, ok, want, wantOK)
		}
	})
}

// build makes an error tree from bytes: each byte picks a node kind.
func build(shape []byte) error {
	if len(shape) == 0 {
		return nil
	}
	rest := shape[1:]
	switch shape[0] % 5 {
	case 0:
		return &codeError{int(shape[0])}
	case 1:
		return fmt.Errorf("w: %w", build(rest))
	case 2:
		half := len(rest) / 2
		return multi{build(rest[:half]), build(rest[half:])}
	case 3:
		return asCode{int(shape[0])}
	}
	return errors.New("leaf")
}
