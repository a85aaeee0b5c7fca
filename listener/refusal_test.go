package listener_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// runFor runs l until it returns or the timeout passes, and says which.
func runFor(t *testing.T, l *listener.Listener, timeout time.Duration) (took time.Duration, returned bool, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	begin := time.Now()
	err = l.Run(ctx)
	return time.Since(begin), ctx.Err() == nil, err
}

// Moving an existing classic queue to the layout the README recommends,
// wired as the README wires it: the broker refuses the quorum declaration,
// and Run ends within seconds with the *dlx.ConflictError, which unwraps to
// the broker's 406 and names SkipWorkQueue, instead of redialling for ever.
func TestDeclareConflictThroughTheTopologyEndsRun(t *testing.T) {
	q := brokertest.Name(t, "orders")
	brokertest.Queue(t, q, nil) // classic, as it was before
	topo := dlx.Topology{Queue: q, Type: dlx.Quorum}
	t.Cleanup(func() { brokertest.DeleteQueue(t, topo.DLQ()) })
	var log testlog.Buffer
	l, err := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(brokertest.URL()), listener.WithDeclare(topo.Declare), listener.WithLogger(log.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	took, returned, err := runFor(t, l, 20*time.Second)
	if !returned {
		t.Fatalf("Run did not return within 20s; it logged:\n%s", log.String())
	}
	var ce *dlx.ConflictError
	var aerr *amqp.Error
	if !errors.As(err, &ce) || !errors.As(err, &aerr) || aerr.Code != amqp.PreconditionFailed || !strings.Contains(err.Error(), "SkipWorkQueue") {
		t.Fatalf("Run = %v, want a *dlx.ConflictError that unwraps to the broker's 406 and names SkipWorkQueue", err)
	}
	if took > 5*time.Second || log.Count("redialing") > 0 {
		t.Errorf("Run took %v and redialled %d times before giving up", took, log.Count("redialing"))
	}
}

// A declaration that fails for something another service may yet fix (a
// binding to an exchange that does not exist yet: 404) is retried, with a
// backoff that grows because no connection gets as far as consuming; once
// the exchange exists the listener consumes.
func TestFailingDeclarationBacksOffAndHeals(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	ex := brokertest.Name(t, "ex")
	t.Cleanup(func() { brokertest.DeleteQueue(t, q) })
	declare := func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(q, q, ex, false, nil)
	}
	var log testlog.Buffer
	s := newSeen()
	r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(d.MessageId); return nil },
		listener.WithDeclare(declare), listener.WithLogger(log.Logger()))
	time.Sleep(4 * time.Second)
	if n := log.Count("connection problem; redialing"); n < 2 || n > 10 {
		t.Errorf("redialled %d times in 4s, want a handful with a growing backoff (not one every 100ms, not none)", n)
	}
	brokertest.Exchange(t, ex, "direct")
	brokertest.Eventually(t, 30*time.Second, "consuming once the exchange exists", func() bool { return brokertest.Consumers(t, q) == 1 })
	publishN(t, q, 3)
	brokertest.Eventually(t, 10*time.Second, "the messages handled", func() bool { return s.distinct() == 3 })
	r.Stop(t)
}

// A user without read permission on the queue: basic.consume is refused
// with 403, and Run ends at once with a *ConsumeRefusedError that says so,
// instead of retrying for ever and returning nil at the end.
func TestConsumeWithoutReadPermissionEndsRun(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	user := brokertest.Name(t, "user")
	brokertest.Rabbitmqctl(t, "add_user", user, "secret-password")
	t.Cleanup(func() { _, _ = brokertest.Ctl("delete_user", user) })
	brokertest.Rabbitmqctl(t, "set_permissions", user, ".*", ".*", "^$") // configure, write, no read
	l, err := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(brokertest.WithCredentials(user, "secret-password")), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	took, returned, err := runFor(t, l, 20*time.Second)
	var refused *listener.ConsumeRefusedError
	if !returned || !errors.As(err, &refused) || refused.Err.Code != amqp.AccessRefused || !strings.Contains(err.Error(), "read permission") {
		t.Fatalf("Run = %v after %v, want a *ConsumeRefusedError (403) naming the read permission", err, took)
	}
	if took > 5*time.Second {
		t.Errorf("Run took %v to give up", took)
	}
}

// A user who may not configure (declare) the topology's queues, wired as the
// README wires it: the broker refuses the declaration with 403 and Run ends
// at once with an error that unwraps to it.
func TestDeclareWithoutConfigurePermissionEndsRun(t *testing.T) {
	topo := dlx.Topology{Queue: brokertest.Name(t, "orders")}
	user := brokertest.Name(t, "user")
	brokertest.Rabbitmqctl(t, "add_user", user, "secret-password")
	t.Cleanup(func() { _, _ = brokertest.Ctl("delete_user", user) })
	brokertest.Rabbitmqctl(t, "set_permissions", user, "^$", ".*", ".*") // no configure
	l, err := listener.New(topo.Queue, nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(brokertest.WithCredentials(user, "secret-password")), listener.WithDeclare(topo.Declare), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	took, returned, err := runFor(t, l, 20*time.Second)
	var aerr *amqp.Error
	if !returned || !errors.As(err, &aerr) || aerr.Code != amqp.AccessRefused {
		t.Fatalf("Run = %v after %v, want the broker's 403 at once", err, took)
	}
	if took > 5*time.Second {
		t.Errorf("Run took %v to give up", took)
	}
}
