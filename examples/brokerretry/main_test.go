package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/examples/internal/exampleutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBrokerRetry(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, exampleutil.URL(), []time.Duration{300 * time.Millisecond, 600 * time.Millisecond}); err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	s := out.String()
	for _, want := range []string{
		"attempt 3 (broker retries so far: 0)",
		"attempt 1 (broker retries so far: 1)",
		"attempt 1 (broker retries so far: 2)",
		"on the DLQ after 2 broker retries: payment provider down",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q\n%s", want, s)
		}
	}
}
