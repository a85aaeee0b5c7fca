package reliability

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// secretUser creates a broker user whose password is easy to spot, and
// removes it when the test ends.
func secretUser(t *testing.T) (user, password string) {
	t.Helper()
	brokertest.Dial(t)
	user, password = brokertest.Name(t, "user"), "Pw-3f9a1c-do-not-log"
	brokertest.Rabbitmqctl(t, "add_user", user, password)
	t.Cleanup(func() { _, _ = brokertest.Ctl("delete_user", user) })
	brokertest.Rabbitmqctl(t, "set_permissions", user, ".*", ".*", ".*")
	return user, password
}

// Connection failures are logged and returned with the URL, but never the
// password, whatever fails: the login, the network, the redial.
func TestPasswordsNeverLeak(t *testing.T) {
	user, password := secretUser(t)
	proxy, _ := brokertest.Proxy(t)
	good, _ := proxy.URL(brokertest.WithCredentials(user, password))
	wrong := brokertest.WithCredentials(user, password+"-wrong")
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, q, nil)
	brokertest.Queue(t, dlq, nil)
	book := newLogBook()
	var leaks []string
	check := func(where, text string) {
		if strings.Contains(text, password) {
			leaks = append(leaks, where+": "+text)
		}
	}

	// A refused login, from New and from Run.
	_, err := publisher.New(wrong, publisher.WithLogger(book.logger()))
	check("publisher.New error", fmt.Sprint(err))
	l, _ := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(wrong), listener.WithLogger(book.logger()))
	check("listener.Run error", fmt.Sprint(l.Run(ctxTimeout(t, 10*time.Second))))

	// Redials through an outage, logged as they happen.
	pub, err := publisher.New(good, publisher.WithLogger(book.logger()))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	l, _ = listener.New(q, middleware.Recover(recoverer.Republish(pub, "", dlq)),
		func(context.Context, *amqp.Delivery) error { return errors.New("failing on purpose") },
		listener.WithURL(good), listener.WithLogger(book.logger()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "m"})
	brokertest.Eventually(t, 10*time.Second, "the message on the DLQ", func() bool { return brokertest.Depth(t, dlq) == 1 })
	proxy.Refuse(true)
	proxy.CutAll()
	brokertest.Eventually(t, 10*time.Second, "redial failures logged", func() bool {
		_, lRedial := book.first("listener: connection problem", time.Time{})
		_, pRedial := book.first("publisher: redial failed", time.Time{})
		return lRedial && pRedial
	})
	err = pub.Publish(ctxTimeout(t, 500*time.Millisecond), "", q, amqp.Publishing{})
	check("Publish error during the outage", fmt.Sprint(err))
	proxy.Refuse(false)
	cancel()
	check("listener.Run error after the outage", fmt.Sprint(<-done))

	// The dead letter's headers.
	d, _ := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	for k, v := range d.Headers {
		check("header "+k, fmt.Sprint(v))
	}
	check("logs", book.all())
	if !strings.Contains(book.all(), user+":xxxxx@") {
		t.Errorf("the logs should name the URL with the password hidden:\n%s", book.all())
	}
	for _, leak := range leaks {
		t.Errorf("password leaked in %s", leak)
	}
}
