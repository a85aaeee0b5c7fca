package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func brokerURL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The service as a pod runs it: ready once both queues consume, a good and
// a bad order handled (the bad one on the DLQ and in /stats), and a clean
// stop when its context ends (SIGTERM).
func TestService(t *testing.T) {
	prefix := fmt.Sprintf("amqpretry-example.service.%d", time.Now().UnixNano())
	env := map[string]string{"AMQP_URL": brokerURL(), "HTTP_ADDR": "127.0.0.1:0", "QUEUE_PREFIX": prefix, "SHUTDOWN_TIMEOUT": "2s"}
	defer deleteTopologies(prefix)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, func(k string) string { return env[k] }, slog.New(slog.NewTextHandler(io.Discard, nil)), func(a string) { addr <- a })
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not ready within 20s")
	}
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	conn, err := amqp.Dial(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"id":"42"}`, `{"id":`} {
		if err := ch.Publish("", prefix+".orders", false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := get(t, base+"/stats")
		var stats []struct {
			Queue                 string
			Handled, DeadLettered uint64
		}
		if err := json.Unmarshal([]byte(body), &stats); err != nil {
			t.Fatalf("/stats: %v: %s", err, body)
		}
		if len(stats) == 2 && stats[0].Handled == 2 && stats[0].DeadLettered == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/stats never showed the good and the dead order: %s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if q, err := ch.QueueDeclarePassive(prefix+".orders.dlq", true, false, false, false, nil); err != nil || q.Messages != 1 {
		t.Errorf("the DLQ holds %d (%v), want the bad order", q.Messages, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run returned %v after its context ended", err)
	}
}

func TestConfigFromTheEnvironment(t *testing.T) {
	if _, err := configFrom(func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "AMQP_URL is required") {
		t.Errorf("no AMQP_URL: %v", err)
	}
	bad := map[string]string{"AMQP_URL": "amqp://x/", "SHUTDOWN_TIMEOUT": "soon"}
	if _, err := configFrom(func(k string) string { return bad[k] }); err == nil || !strings.Contains(err.Error(), "SHUTDOWN_TIMEOUT") {
		t.Errorf("a bad SHUTDOWN_TIMEOUT: %v", err)
	}
}

// deleteTopologies removes what the test's service declared (its own
// prefix: no one else's queues).
func deleteTopologies(prefix string) {
	conn, err := amqp.Dial(brokerURL())
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, q := range []string{prefix + ".orders", prefix + ".refunds"} {
		_, _ = ch.QueueDelete(q, false, false, false)
		_, _ = ch.QueueDelete(q+".dlq", false, false, false)
		_ = ch.ExchangeDelete(q+".dlx", false, false)
	}
}
