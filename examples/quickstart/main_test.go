package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/dlx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func url() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// The demo on a topology of the test's own: both messages retry side by
// side, end on the DLQ and stay there, and the demo ends with the command
// that lists them.
func TestQuickstart(t *testing.T) {
	topo := dlx.Topology{Queue: fmt.Sprintf("amqpretry-test.quickstart.%d", time.Now().UnixNano())}
	t.Cleanup(func() { deleteTopology(t, topo) })
	var out bytes.Buffer
	if err := run(context.Background(), &out, url(), topo, 100*time.Millisecond); err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	s := out.String()
	for _, want := range []string{
		"msg1: attempt 1 failed; next in 100ms",
		"msg1: attempt 4 failed; next in 800ms",
		"msg2: attempt 5",
		"msg1: on " + topo.DLQ() + " after 5 attempts (user service unavailable), confirmed",
		"msg2: on " + topo.DLQ() + " after 5 attempts (user service unavailable), confirmed",
		"go run ./cmd/amqpretry dlq list " + topo.DLQ() + "\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// msg2 must not wait for msg1: its first attempt comes before msg1's second.
	if strings.Index(s, "msg2: attempt 1\n") > strings.Index(s, "msg1: attempt 2\n") {
		t.Errorf("msg2 waited for msg1's retries")
	}
	// The dead letters stay on the DLQ for the CLI to show, and the work
	// queue is empty: every message was acked once it was safe.
	if dlq, work := depth(t, topo.DLQ()), depth(t, topo.Queue); dlq != 2 || work != 0 {
		t.Errorf("the DLQ holds %d and the work queue %d; want 2 and 0", dlq, work)
	}
	if t.Failed() {
		t.Log(s)
	}
}

func depth(t *testing.T, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(url())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// deleteTopology deletes what the test's run declared.
func deleteTopology(t *testing.T, topo dlx.Topology) {
	conn, err := amqp.Dial(url())
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Error(err)
		return
	}
	for _, q := range []string{topo.Queue, topo.DLQ()} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Error(err)
		}
	}
	if err := ch.ExchangeDelete(topo.DLX(), false, false); err != nil {
		t.Error(err)
	}
}
