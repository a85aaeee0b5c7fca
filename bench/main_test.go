package main

import (
	"testing"

	"go.uber.org/goleak"
)

// Every listener, subscriber, publisher and connection a run starts must be
// gone when it returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
