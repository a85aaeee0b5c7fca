package errtext

import (
	"fmt"
	"strings"
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
	return strings.ToValidUTF8(err.Error(), "\uFFFD")
}
