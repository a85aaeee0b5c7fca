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

func TestScaling(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := run(ctx, &out, exampleutil.URL(), 1500, 20*time.Millisecond); err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	s := out.String()
	if !strings.Contains(s, "backlog drained with up to 8 consumers") || !strings.Contains(s, "back to one consumer") {
		t.Errorf("the listener did not grow to 8 and back to 1:\n%s", s)
	}
}
