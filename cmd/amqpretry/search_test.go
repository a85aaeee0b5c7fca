package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// --match reads in any case by default, over the exception, the headers
// and the body as well as the id (issue 40: the README's --match 'timeout'
// found none of 743 "Client.Timeout" errors); --error-type selects by the
// recoverer's error type; a selection that selects nothing says so and
// exits 1, on list, show and replay alike.
func TestMatchAndErrorTypeSelect(t *testing.T) {
	topo := withDeadLetters(t, 4) // even: "customer not found", odd: "tax service\ntimed out"
	brokertest.Publish(t, topo.DLQ(), amqp.Publishing{MessageId: "tenant", Headers: amqp.Table{"tenant": "ACME-42"}, Body: []byte(`{"Status":"Client.Timeout exceeded"}`)})
	for _, tt := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"--match", "CUSTOMER NOT"}, []string{"order-0", "order-2", "2 message(s) shown"}, []string{"order-1", "order-3", "tenant"}},
		{[]string{"--match", "timed OUT"}, []string{"order-1", "order-3"}, []string{"order-0", "tenant"}},
		{[]string{"--match", "acme-42"}, []string{"tenant", "1 message(s) shown"}, []string{"order-0"}},          // a header
		{[]string{"--match", "client\\.timeout"}, []string{"tenant", "1 message(s) shown"}, []string{"order-1"}}, // the body
		{[]string{"--match", "customer", "--limit", "1"}, []string{"order-0", "1 message(s) shown"}, []string{"order-2"}},
		{[]string{"--error-type", "*ERRORS.errorString"}, []string{"order-0", "order-3", "4 message(s) shown"}, []string{"tenant"}},
	} {
		code, out, errOut := amqpretry(t, append([]string{"dlq", "list", topo.DLQ()}, tt.args...)...)
		if code != 0 {
			t.Errorf("list %v: exit %d: %s", tt.args, code, errOut)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("list %v lacks %q:\n%s", tt.args, w, out)
			}
		}
		for _, w := range tt.not {
			if strings.Contains(out, w) {
				t.Errorf("list %v shows %q:\n%s", tt.args, w, out)
			}
		}
	}
	code, out, errOut := amqpretry(t, "dlq", "show", topo.DLQ(), "--match", "timed out", "--id", "order-3")
	if code != 0 || !strings.Contains(out, "message id:     order-3") {
		t.Errorf("show --match 'timed out' --id order-3: exit %d, want order-3:\n%s%s", code, out, errOut)
	}
	for _, cmd := range []string{"list", "show", "replay"} {
		code, out, errOut := amqpretry(t, "dlq", cmd, topo.DLQ(), "--match", "no such cause")
		if code != 1 || !strings.Contains(errOut, `no message matching --match "no such cause" (in any case`) || !strings.Contains(errOut, "of 5 looked at") {
			t.Errorf("%s --match selecting nothing: exit %d, want 1 and why:\n%s%s", cmd, code, out, errOut)
		}
		code, out, errOut = amqpretry(t, "dlq", cmd, topo.DLQ(), "--error-type", "*net.OpError")
		if code != 1 || !strings.Contains(errOut, `with --error-type "*net.OpError"`) {
			t.Errorf("%s --error-type selecting nothing: exit %d, want 1 and why:\n%s%s", cmd, code, out, errOut)
		}
	}
	if code, out, errOut := amqpretry(t, "dlq", "list", topo.DLQ(), "--match", "CUSTOMER", "--case-sensitive"); code != 1 {
		t.Errorf("--case-sensitive: exit %d:\n%s%s", code, out, errOut)
	}
	if n := brokertest.Depth(t, topo.DLQ()); n != 5 {
		t.Errorf("the DLQ holds %d, want all 5: looking and replaying nothing moves nothing", n)
	}
}

// replay --dry-run prints what it would move and where, and moves nothing.
func TestReplayDryRunMovesNothing(t *testing.T) {
	topo := withDeadLetters(t, 4)
	code, out, errOut := amqpretry(t, "dlq", "replay", topo.DLQ(), "--match", "tax service", "--dry-run")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, w := range []string{"order-1", "order-3", "queue " + topo.Queue, "dry run: would replay 2 message(s) from " + topo.DLQ() + ", of 4 looked at; nothing was moved"} {
		if !strings.Contains(out, w) {
			t.Errorf("dry run lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "order-0") {
		t.Errorf("dry run lists a message --match does not select:\n%s", out)
	}
	if d, w := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, topo.Queue); d != 4 || w != 0 {
		t.Errorf("after a dry run the DLQ holds %d (want 4) and the work queue %d (want 0)", d, w)
	}
	if code, out, _ := amqpretry(t, "dlq", "replay", topo.DLQ(), "--dry-run", "--limit", "1", "--to", "elsewhere"); code != 0 || !strings.Contains(out, "would replay 1 message(s)") || !strings.Contains(out, "queue elsewhere") {
		t.Errorf("dry run --limit 1 --to elsewhere: exit %d:\n%s", code, out)
	}
}

// The README's example, --match timeout, selects what Go's HTTP client
// returns when its Timeout runs out ("... (Client.Timeout exceeded while
// awaiting headers)"): issue 40 found it matched 0 of 743 such dead letters.
// (The test's name, in every queue name and so in headers, must not say
// "timeout".)
func TestREADMEMatchFindsGoHTTPClientErrors(t *testing.T) {
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(hang)
	client := &http.Client{Timeout: 50 * time.Millisecond}
	resp, err := client.Get(srv.URL)
	if err == nil {
		resp.Body.Close()
		t.Fatal("the hanging server answered")
	}
	topo := withDeadLetters(t, 2) // two that are not timeouts
	deadLetter(t, topo, "payment-1", err)
	t.Logf("the dead letter's exception: %v", err)
	code, out, errOut := amqpretry(t, "dlq", "list", topo.DLQ(), "--match", "timeout", "--error-type", "*http.timeoutError")
	if code != 0 || !strings.Contains(out, "payment-1") || !strings.Contains(out, "1 message(s) shown") {
		t.Errorf("list --match timeout --error-type *http.timeoutError: exit %d, want payment-1 alone:\n%s%s", code, out, errOut)
	}
	code, out, errOut = amqpretry(t, "dlq", "replay", topo.DLQ(), "--match", "timeout", "--limit", "100", "--to", topo.Queue, "--dry-run")
	if code != 0 || !strings.Contains(out, "payment-1") || !strings.Contains(out, "would replay 1 message(s)") {
		t.Fatalf("--match timeout --dry-run: exit %d, want payment-1 alone:\n%s%s", code, out, errOut)
	}
	code, out, errOut = amqpretry(t, "dlq", "replay", topo.DLQ(), "--match", "timeout", "--limit", "100", "--to", topo.Queue)
	if code != 0 || !strings.Contains(out, "replayed 1 message(s)") {
		t.Fatalf("--match timeout: exit %d:\n%s%s", code, out, errOut)
	}
	if d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), topo.Queue); !ok || d.MessageId != "payment-1" {
		t.Errorf("the work queue holds %q, want payment-1", d.MessageId)
	}
}

// deadLetter puts one message with id on topo's DLQ, as the recoverer does
// when a handler fails with cause.
func deadLetter(t *testing.T, topo dlx.Topology, id string, cause error) {
	t.Helper()
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: id, Body: []byte(`{}`)})
	ch := brokertest.Channel(t, brokertest.Dial(t))
	d, ok := brokertest.Get(t, ch, topo.Queue)
	if !ok {
		t.Fatal("the work queue is empty")
	}
	if err := recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey()).Recover(chainrun.WithQueue(context.Background(), topo.Queue), &d, cause); err != nil {
		t.Fatal(err)
	}
	_ = d.Ack(false)
}
