package brokertest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
)

// RequireEnv is the variable that turns a missing broker into a failure.
const RequireEnv = "AMQPRETRY_REQUIRE_BROKER"

// URL is $AMQP_URL, or the local broker.
func URL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return amqpurl.Default
}

// Addr is the host:port of the broker at URL(), where a fault proxy forwards.
func Addr() string {
	uri, err := amqp.ParseURI(URL())
	if err != nil {
		panic(fmt.Sprintf("brokertest: $AMQP_URL %s: %v", amqpurl.Redact(URL()), err))
	}
	return net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
}

// WithCredentials is URL() with another user name and password.
func WithCredentials(user, password string) string {
	u, err := url.Parse(URL())
	if err != nil {
		panic(fmt.Sprintf("brokertest: $AMQP_URL %s: %v", amqpurl.Redact(URL()), err))
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// Proxy starts a fault proxy in front of the broker under test, closed when
// the test ends, and returns it with the URL that reaches the broker through
// it.
func Proxy(t testing.TB) (*faultproxy.Proxy, string) {
	t.Helper()
	p, err := faultproxy.Start(Addr())
	if err != nil {
		t.Fatalf("start fault proxy: %v", err)
	}
	t.Cleanup(p.Close)
	u, err := p.URL(URL())
	if err != nil {
		t.Fatal(err)
	}
	return p, u
}

// Required reports whether tests must fail rather than skip without a broker.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Dial connects to the broker and closes the connection when the test ends.
// Without a broker it fails the test under make test and skips it otherwise.
func Dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		msg := fmt.Sprintf("no RabbitMQ broker at %s: %v (run scripts/broker.sh to start one)", amqpurl.Redact(URL()), err)
		if Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Major returns the major version of the broker under test: 3 or 4.
func Major(t testing.TB) int {
	t.Helper()
	major, _ := Version(t)
	return major
}

// Version returns the major and minor version of the broker under test
// (3, 10 for RabbitMQ 3.10.8), from the server properties of a connection.
func Version(t testing.TB) (major, minor int) {
	t.Helper()
	v := amqpconn.VersionOf(Dial(t).Properties)
	if !v.Known {
		t.Fatalf("the broker reports version %q", Dial(t).Properties["version"])
	}
	return v.Major, v.Minor
}

// AtLeast reports whether the broker under test is version major.minor or
// newer.
func AtLeast(t testing.TB, major, minor int) bool {
	t.Helper()
	ma, mi := Version(t)
	return ma > major || (ma == major && mi >= minor)
}

// Channel opens a channel on conn, closed when the test ends.
func Channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// Name returns a name unique to this test run, for queues and exchanges, so
// that tests running in parallel, or left over from a crashed run, never meet.
func Name(t testing.TB, suffix string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := unsafeChars.ReplaceAllString(t.Name(), "_")
	if len(name) > 80 {
		name = name[len(name)-80:]
	}
	if suffix != "" {
		suffix = "." + suffix
	}
	return "amqpretry-test." + name + "." + hex.EncodeToString(b[:]) + suffix
}

// Queue declares a durable classic queue with the given arguments and deletes
// it when the test ends, on a connection of its own so that the cleanup works
// even when the test's channels have been closed by the broker.
func Queue(t testing.TB, name string, args amqp.Table) {
	t.Helper()
	ch := Channel(t, Dial(t))
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declare queue %s: %v", name, err)
	}
	t.Cleanup(func() { DeleteQueue(t, name) })
}

// Exchange declares a durable exchange and deletes it when the test ends.
func Exchange(t testing.TB, name, kind string) {
	t.Helper()
	ch := Channel(t, Dial(t))
	if err := ch.ExchangeDeclare(name, kind, true, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange %s: %v", name, err)
	}
	t.Cleanup(func() {
		conn, err := amqp.Dial(URL())
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(name, false, false)
		}
	})
}

// Bind binds queue to exchange with key.
func Bind(t testing.TB, queue, exchange, key string) {
	t.Helper()
	ch := Channel(t, Dial(t))
	if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
		t.Fatalf("bind %s to %s with %q: %v", queue, exchange, key, err)
	}
}

// DeleteQueue deletes a queue on a fresh connection, ignoring a missing one.
func DeleteQueue(t testing.TB, name string) {
	conn, err := amqp.Dial(URL())
	if err != nil {
		t.Logf("cleanup: cannot delete queue %s: %v", name, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	_, _ = ch.QueueDelete(name, false, false, false)
}

// Depth returns the number of ready messages in a queue.
func Depth(t testing.TB, name string) int {
	t.Helper()
	return inspect(t, name).Messages
}

// inspect reads a queue's counts with a passive declare, failing the test if
// the queue does not exist.
func inspect(t testing.TB, name string) amqp.Queue {
	t.Helper()
	q, err := Channel(t, Dial(t)).QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect queue %s: %v", name, err)
	}
	return q
}

// Get takes one message from a queue and acks it; ok is false when the queue
// is empty.
func Get(t testing.TB, ch *amqp.Channel, queue string) (amqp.Delivery, bool) {
	t.Helper()
	d, ok, err := ch.Get(queue, false)
	if err != nil {
		t.Fatalf("get from %s: %v", queue, err)
	}
	if ok {
		if err := d.Ack(false); err != nil {
			t.Fatalf("ack get from %s: %v", queue, err)
		}
	}
	return d, ok
}

// CountBodies takes every message from a queue, acking each, and counts
// them by body.
func CountBodies(t testing.TB, ch *amqp.Channel, queue string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for {
		d, ok := Get(t, ch, queue)
		if !ok {
			return counts
		}
		counts[string(d.Body)]++
	}
}

// Publish publishes body to the default exchange, routed to queue, and waits
// for the broker's confirm.
func Publish(t testing.TB, queue string, msgs ...amqp.Publishing) {
	t.Helper()
	ch := Channel(t, Dial(t))
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm mode: %v", err)
	}
	for _, m := range msgs {
		conf, err := ch.PublishWithDeferredConfirm("", queue, true, false, m)
		if err != nil {
			t.Fatalf("publish to %s: %v", queue, err)
		}
		if ok := conf.Wait(); !ok {
			t.Fatalf("publish to %s: nacked", queue)
		}
	}
}

// Eventually polls cond every 20ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CtlEnv names the variable that says how to reach the node behind $AMQP_URL
// with rabbitmqctl: a command and its first arguments, split on spaces, such
// as "rabbitmqctl -n rabbit4@localhost" or "scripts/rabbit4.sh ctl". Default
// "rabbitmqctl", the local node.
const CtlEnv = "AMQPRETRY_RABBITMQCTL"

// Ctl runs rabbitmqctl -q with args on the node under test ($AMQPRETRY_RABBITMQCTL)
// and returns its output. It needs no test, for cleanups that must not fail one.
func Ctl(args ...string) (string, error) {
	cmd := strings.Fields(os.Getenv(CtlEnv))
	if len(cmd) == 0 {
		cmd = []string{"rabbitmqctl"}
	}
	cmd = append(append(cmd, "-q"), args...)
	out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w\n%s", strings.Join(cmd, " "), err, out)
	}
	return string(out), nil
}

// Rabbitmqctl is Ctl that fails the test when the command does.
func Rabbitmqctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := Ctl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Consumers returns how many consumers the broker counts on a queue.
func Consumers(t testing.TB, queue string) int {
	t.Helper()
	return inspect(t, queue).Consumers
}

// Unacked returns how many of a queue's messages the broker counts delivered
// and not acknowledged yet (rabbitmqctl list_queues messages_unacknowledged,
// which the queue answers itself, not from the statistics database).
func Unacked(t testing.TB, queue string) int {
	t.Helper()
	out := Rabbitmqctl(t, "list_queues", "-q", "--no-table-headers", "name", "messages_unacknowledged")
	for _, line := range strings.Split(out, "\n") {
		name, count, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if ok && name == queue {
			n, err := strconv.Atoi(strings.TrimSpace(count))
			if err != nil {
				t.Fatalf("rabbitmqctl list_queues: %q is not a count of %s's unacknowledged messages", count, queue)
			}
			return n
		}
	}
	t.Fatalf("rabbitmqctl list_queues does not list %s:\n%s", queue, out)
	return 0
}

// CloseConnections closes, from the broker's side, every connection whose
// client-provided connection_name contains name, as an operator or a broker
// restart would (320 CONNECTION_FORCED). It returns how many it closed.
func CloseConnections(t testing.TB, name string) int {
	t.Helper()
	out := Rabbitmqctl(t, "list_connections", "pid", "client_properties")
	closed := 0
	for _, line := range strings.Split(out, "\n") {
		pid, props, ok := strings.Cut(line, "\t")
		if !ok || !strings.Contains(props, `{"connection_name","`) || !strings.Contains(props, name) {
			continue
		}
		if _, err := Ctl("close_connection", pid, "closed by a test"); err == nil {
			closed++
		}
	}
	return closed
}

// QueueExists reports whether the queue exists, without failing the test.
func QueueExists(t testing.TB, name string) bool {
	t.Helper()
	ch := Channel(t, Dial(t))
	_, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	return err == nil
}
