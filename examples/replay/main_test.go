package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/examples/internal/exampleutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestReplay(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, exampleutil.URL()); err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	s := out.String()
	for _, want := range []string{"5 orders failed", "replayed 5, skipped 0", "handled order-4 (headers now: map[region:EU-7])", "all 5 handled; amqpretry.replay.", ".dlq is empty: true"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q\n%s", want, s)
		}
	}
}
