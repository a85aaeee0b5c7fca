package publisher_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/publisher"
)

// New tells a refused login (a wrong password, 403; no permission on the
// virtual host, 530) with ErrLoginRefused, and a connection limit reached
// (530 too, but it heals) without it.
func TestNewTellsARefusedLogin(t *testing.T) {
	brokertest.Dial(t)
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
	u.Path = "/" + vhost
	inVhost := u.String()
	newFails := func(url string) error {
		t.Helper()
		p, err := publisher.New(url)
		if err == nil {
			p.Close()
			t.Fatal("New succeeded")
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("New = %v: it leaks the password", err)
		}
		return err
	}
	for _, tt := range []struct {
		name, url string
		code      int
	}{
		{"wrong password", brokertest.WithCredentials("guest", "wrong-hunter2"), amqp.AccessRefused},
		{"no permission on the virtual host", inVhost, amqp.NotAllowed},
	} {
		err := newFails(tt.url)
		var aerr *amqp.Error
		if !errors.Is(err, publisher.ErrLoginRefused) || !errors.As(err, &aerr) || aerr.Code != tt.code {
			t.Errorf("%s: New = %v, want ErrLoginRefused unwrapping to the broker's %d", tt.name, err, tt.code)
		}
	}
	brokertest.Rabbitmqctl(t, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
	brokertest.Rabbitmqctl(t, "set_vhost_limits", "-p", vhost, `{"max-connections": 0}`)
	if err := newFails(inVhost); errors.Is(err, publisher.ErrLoginRefused) || !strings.Contains(err.Error(), "connection limit") {
		t.Errorf("connection limit: New = %v, want the broker's connection limit, not ErrLoginRefused", err)
	}
}
