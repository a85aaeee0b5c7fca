package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func url() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func TestQuickstart(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, url(), 100*time.Millisecond); err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	s := out.String()
	for _, want := range []string{
		"msg1: attempt 1 failed; next in 100ms",
		"msg1: attempt 4 failed; next in 800ms",
		"msg2: attempt 5",
		"got dead message msg1 (user service unavailable, after 5 attempts)",
		"got dead message msg2 (user service unavailable, after 5 attempts)",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// msg2 must not wait for msg1: its first attempt comes before msg1's second.
	if strings.Index(s, "msg2: attempt 1\n") > strings.Index(s, "msg1: attempt 2\n") {
		t.Errorf("msg2 waited for msg1's retries")
	}
	if t.Failed() {
		t.Log(s)
	}
}
