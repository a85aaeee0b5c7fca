package chainrun_test

import (
	"errors"
	"testing"

	"go.uber.org/goleak"
)

var errBoom = errors.New("boom")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
