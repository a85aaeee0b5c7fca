package errtext

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// String is err.Error(), made valid UTF-8, or a description of err when its
// Error method panics. It is "" for a nil error.
func String(err error) (s string) {
	if err == nil {
		return ""
	}
	defer func() {
		if v := recover(); v != nil {
			s = fmt.Sprintf("%T (its Error method panicked: %v)", err, v)
		}
	}()
	s = err.Error()
	if utf8.ValidString(s) { // the common case, checked several times faster than ToValidUTF8 does
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
