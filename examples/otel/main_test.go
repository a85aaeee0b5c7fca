package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOtelExample(t *testing.T) {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	var out bytes.Buffer
	if err := run(context.Background(), &out, url); err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	for _, want := range []string{
		`"Name": "process amqpretry.otel.`, `"Name": "attempt"`, `"Name": "send amq.default"`,
		`"Name": "retry scheduled"`, "amqpretry.attempts", "messaging.process.duration",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %s", want)
		}
	}
	if t.Failed() {
		t.Log(out.String())
	}
}
