package main

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amqpretry/amqpretry/internal/testlog"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The README's complete program, built and run as a user runs it, in a
// virtual host of its own (its queue names are fixed, and another "orders"
// on the broker is not ours to touch): the good order is handled, the bad
// JSON is on orders.dlq at once with the reason in its headers, and SIGTERM
// ends it with status 0, the order still retrying handed back to its queue.
func TestProgramRunsAsPrinted(t *testing.T) {
	vhostURL := ownVhost(t)
	bin := filepath.Join(t.TempDir(), "orders")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var logs testlog.Buffer
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "AMQP_URL="+vhostURL)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	conn, err := amqp.Dial(vhostURL)
	if err != nil {
		t.Fatalf("dial %s: %v", vhostURL, err)
	}
	defer conn.Close()
	deadline := time.Now().Add(10 * time.Second) // order 2's retries take 15 s: it is still retrying
	for !strings.Contains(logs.String(), "order 1: 3 books") || depth(t, conn, "orders.dlq") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s the program has not handled order 1 and parked the bad JSON (orders.dlq: %d); its output:\n%s",
				depth(t, conn, "orders.dlq"), logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("after SIGTERM the program ended with %v, want status 0; its output:\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the program did not end within 30 s of SIGTERM; its output:\n%s", logs.String())
	}
	if work, dead := depth(t, conn, "orders"), depth(t, conn, "orders.dlq"); work != 1 || dead != 1 {
		t.Fatalf("orders holds %d and orders.dlq %d messages; want 1 (order 2, handed back) and 1 (the bad JSON)", work, dead)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	d, ok, err := ch.Get("orders.dlq", false)
	if err != nil || !ok {
		t.Fatalf("get from orders.dlq: %v, %v", ok, err)
	}
	reason, _ := d.Headers["x-exception-message"].(string)
	if string(d.Body) != "not json" || !strings.Contains(reason, "invalid character") {
		t.Errorf("the dead letter is %q with x-exception-message %q; want the bad JSON and the decoder's error", d.Body, reason)
	}
}

// ownVhost creates a virtual host for the test, open to the URL's user,
// and deletes it (and so everything in it) when the test ends. It returns
// $AMQP_URL (or the local broker's) with that virtual host.
func ownVhost(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(cmp.Or(os.Getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"))
	if err != nil {
		t.Fatal(err)
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	vhost := "amqpretry-test-readme-" + hex.EncodeToString(r[:])
	user := cmp.Or(u.User.Username(), "guest")
	rabbitmqctl(t, "add_vhost", vhost)
	t.Cleanup(func() {
		if out, err := ctl("delete_vhost", vhost); err != nil {
			t.Errorf("delete_vhost %s: %v\n%s", vhost, err, out)
		}
	})
	rabbitmqctl(t, "set_permissions", "-p", vhost, user, ".*", ".*", ".*")
	u.Path = "/" + vhost
	return u.String()
}

// ctl runs rabbitmqctl on the node under test: $AMQPRETRY_RABBITMQCTL, a
// command and its first arguments, or rabbitmqctl itself.
func ctl(args ...string) (string, error) {
	cmd := strings.Fields(os.Getenv("AMQPRETRY_RABBITMQCTL"))
	if len(cmd) == 0 {
		cmd = []string{"rabbitmqctl"}
	}
	cmd = append(append(cmd, "-q"), args...)
	out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
	return string(out), err
}

func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	if out, err := ctl(args...); err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func depth(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
		return 0 // not declared yet
	}
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}
