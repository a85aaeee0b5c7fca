package errtext_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/amqpretry/amqpretry/internal/errtext"
)

type nilDeref struct{ msg string }

func (e *nilDeref) Error() string { return e.msg }

type panicky struct{}

func (panicky) Error() string { panic("boom") }

func TestString(t *testing.T) {
	var typedNil *nilDeref
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"plain", errors.New("queue full"), "queue full"},
		{"wrapped", fmt.Errorf("save: %w", errors.New("timeout")), "save: timeout"},
		{"not UTF-8", errors.New("bad \xff byte"), "bad \uFFFD byte"},
		{"typed nil whose Error dereferences", typedNil, "*errtext_test.nilDeref (its Error method panicked: runtime error: invalid memory address or nil pointer dereference)"},
		{"Error panics", panicky{}, "errtext_test.panicky (its Error method panicked: boom)"},
		{"fmt catches it when wrapping", fmt.Errorf("outer: %w", panicky{}), "outer: %!v(PANIC=Error method: boom)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := errtext.String(tt.err); got != tt.want {
				t.Errorf("String = %q, want %q", got, tt.want)
			}
		})
	}
}
