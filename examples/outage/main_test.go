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

// A 2 s outage over 400 messages: without the kill switch most of those
// that arrive during it end on the DLQ; with it, a few.
func TestOutage(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := run(ctx, &out, exampleutil.URL(), 400, 2*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	s := out.String()
	t.Log("\n" + s)
	if !strings.Contains(s, "without: all 400 settled") || !strings.Contains(s, "with kill switch: all 400 settled") {
		t.Fatalf("a run did not settle every message:\n%s", s)
	}
	if !strings.Contains(s, "kill switch tripped") {
		t.Errorf("the kill switch never tripped:\n%s", s)
	}
}
