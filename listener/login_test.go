package listener_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// vhostOf adds a virtual host of the test's own, deleted when the test ends
// however it ends, and returns its name and the broker's URL with it.
func vhostOf(t *testing.T) (string, string) {
	t.Helper()
	vhost := brokertest.Name(t, "vhost")
	brokertest.Rabbitmqctl(t, "add_vhost", vhost)
	t.Cleanup(func() {
		if out, err := brokertest.Ctl("delete_vhost", vhost); err != nil {
			t.Errorf("delete_vhost %s: %v\n%s", vhost, err, out)
		}
	})
	u, err := url.Parse(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path, u.RawPath = "/"+vhost, ""
	return vhost, u.String()
}

// A login the broker refuses ends Run at once with ErrLoginRefused, whether
// the password is wrong (403) or the user may not use the virtual host (530
// "access to vhost refused"): no redial can change either. The error unwraps
// to the broker's answer and says what to do.
func TestRefusedLoginEndsRun(t *testing.T) {
	t.Parallel()
	brokertest.Dial(t)
	vhost, inVhost := vhostOf(t) // guest has no permission on it
	missing, err := url.Parse(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	missing.Path = "/" + brokertest.Name(t, "no-such-vhost")
	for _, tt := range []struct {
		name, url string
		code      int
		want      string
	}{
		{"wrong password", brokertest.WithCredentials("guest", "wrong-hunter2"), amqp.AccessRefused, "password"},
		{"no permission on the virtual host", inVhost, amqp.NotAllowed, "set_permissions -p " + vhost},
		{"no such virtual host", missing.String(), amqp.NotAllowed, "add_vhost"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var log testlog.Buffer
			l, err := listener.New("q", nil, func(context.Context, *amqp.Delivery) error { return nil },
				listener.WithURL(tt.url), listener.WithLogger(log.Logger()))
			if err != nil {
				t.Fatal(err)
			}
			took, returned, err := runFor(t, l, 20*time.Second)
			if !returned {
				t.Fatalf("Run did not return within 20s; it logged:\n%s", log.String())
			}
			var refused *listener.LoginRefusedError
			var aerr *amqp.Error
			if !errors.Is(err, listener.ErrLoginRefused) || !errors.As(err, &refused) || !errors.As(err, &aerr) || aerr.Code != tt.code {
				t.Fatalf("Run = %v, want ErrLoginRefused, a *LoginRefusedError unwrapping to the broker's %d", err, tt.code)
			}
			if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Run = %v, want it to say %q, password hidden", err, tt.want)
			}
			if took > 5*time.Second || log.Count("redialing") > 0 {
				t.Errorf("Run took %v and redialled %d times before giving up", took, log.Count("redialing"))
			}
			if err := l.WaitReady(context.Background()); !errors.Is(err, listener.ErrLoginRefused) {
				t.Errorf("WaitReady = %v, want Run's ErrLoginRefused", err)
			}
		})
	}
}

// A group's login refused for the virtual host ends the group's Run as a
// lone listener's.
func TestGroupRefusedLoginForTheVirtualHostEndsRun(t *testing.T) {
	_, inVhost := vhostOf(t)
	s := newSeen()
	ls, _ := groupOf(t, 2, s)
	g, err := listener.NewGroup(ls, listener.WithURL(inVhost), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = g.Run(ctx)
	var aerr *amqp.Error
	if ctx.Err() != nil || !errors.Is(err, listener.ErrLoginRefused) || !errors.As(err, &aerr) || aerr.Code != amqp.NotAllowed {
		t.Fatalf("Run = %v (ctx %v), want ErrLoginRefused with the broker's 530, at once", err, ctx.Err())
	}
}

// The other 530, a connection limit reached, is not a refused login: it
// heals when connections close, so the listener redials, and consumes once
// the limit allows it.
func TestConnectionLimitIsRedialled(t *testing.T) {
	t.Parallel()
	vhost, inVhost := vhostOf(t)
	brokertest.Rabbitmqctl(t, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
	brokertest.Rabbitmqctl(t, "set_vhost_limits", "-p", vhost, `{"max-connections": 0}`)
	q := brokertest.Name(t, "q")
	var log testlog.Buffer
	declare := func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		return err
	}
	l, err := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(inVhost), listener.WithDeclare(declare), listener.WithLogger(log.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil after the limit was lifted", err)
		}
	}()
	brokertest.Eventually(t, 20*time.Second, "two redials refused by the connection limit", func() bool {
		return log.Count("connection limit") >= 2
	})
	if s := l.Stats(); !strings.Contains(s.LastConnectionError, "connection limit") {
		t.Errorf("LastConnectionError = %q, want the broker's connection limit", s.LastConnectionError)
	}
	brokertest.Rabbitmqctl(t, "clear_vhost_limits", "-p", vhost)
	wait, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	if err := l.WaitReady(wait); err != nil {
		t.Fatalf("WaitReady = %v once the limit was lifted; it logged:\n%s", err, log.String())
	}
}
