package listener_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// A listener of a group whose declaration finds no exchange yet (a binding
// to an exchange another service declares: 404) is retried on the group's
// connection with a backoff of its own, logged, and shown in
// LastConnectionError, while the others consume; once the exchange exists
// it consumes, as a lone listener would.
func TestGroupRetriesADeclarationThatFoundNoExchange(t *testing.T) {
	s := newSeen()
	ls, qs := groupOf(t, 1, s)
	q, ex := brokertest.Name(t, "late"), brokertest.Name(t, "ex")
	t.Cleanup(func() { brokertest.DeleteQueue(t, q) })
	declare := func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(q, q, ex, false, nil)
	}
	var log testlog.Buffer
	late, err := listener.New(q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(q + "/" + d.MessageId); return nil },
		listener.WithDeclare(declare), listener.WithLogger(log.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	g, err := listener.NewGroup(append(ls, late), listener.WithURL(brokertest.URL()), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil after a shutdown", err)
		}
	}()
	wait, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	if err := ls[0].WaitReady(wait); err != nil {
		t.Fatalf("the other listener: WaitReady = %v", err)
	}
	publishN(t, qs[0], 3)
	brokertest.Eventually(t, 10*time.Second, "the other listener's messages handled meanwhile", func() bool { return s.distinct() == 3 })
	brokertest.Eventually(t, 20*time.Second, "two retries of the declaration logged", func() bool {
		return log.Count("declaration failed; retrying") >= 2
	})
	if e := late.Stats().LastConnectionError; !strings.Contains(e, "404") || !strings.Contains(e, ex) {
		t.Errorf("LastConnectionError = %q, want the 404 naming exchange %s", e, ex)
	}

	brokertest.Exchange(t, ex, "direct")
	if err := late.WaitReady(wait); err != nil {
		t.Fatalf("WaitReady = %v after the exchange appeared; the listener logged:\n%s", err, log.String())
	}
	publishN(t, q, 5)
	brokertest.Eventually(t, 10*time.Second, "the late listener's messages handled", func() bool { return s.distinct() == 8 })
}

// A declaration that fails again after the queue was deleted under a
// running listener (the exchange gone too) ends that session, lone or in a
// group, but not the listener: once the exchange is back, a delivery waits
// between its Retry's attempts as before, instead of being handed back at
// once as at shutdown.
func TestRedeclareFailureLeavesTheNextConsumersUninterrupted(t *testing.T) {
	for _, grouped := range []bool{false, true} {
		t.Run(map[bool]string{false: "lone", true: "group"}[grouped], func(t *testing.T) {
			q, ex := brokertest.Name(t, "q"), brokertest.Name(t, "ex")
			t.Cleanup(func() { brokertest.DeleteQueue(t, q) })
			brokertest.Exchange(t, ex, "direct")
			declare := func(ch *amqp.Channel) error {
				if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
					return err
				}
				return ch.QueueBind(q, q, ex, false, nil)
			}
			s := newSeen()
			chain := middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(200*time.Millisecond)), requeueExhausted())
			handle := func(ctx context.Context, d *amqp.Delivery) error {
				s.add(fmt.Sprint(d.MessageId, "/", middleware.Attempt(ctx)))
				if middleware.Attempt(ctx) == 1 {
					return errors.New("the first attempt fails")
				}
				return nil
			}
			var log testlog.Buffer
			l, err := listener.New(q, chain, handle, listener.WithDeclare(declare), listener.WithURL(brokertest.URL()), listener.WithLogger(log.Logger()))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			if grouped {
				g, err := listener.NewGroup([]*listener.Listener{l}, listener.WithURL(brokertest.URL()), listener.WithLogger(log.Logger()))
				if err != nil {
					t.Fatal(err)
				}
				go func() { done <- g.Run(ctx) }()
			} else {
				go func() { done <- l.Run(ctx) }()
			}
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run = %v, want nil after a shutdown", err)
				}
			}()
			wait, stop := context.WithTimeout(context.Background(), 30*time.Second)
			defer stop()
			if err := l.WaitReady(wait); err != nil {
				t.Fatal(err)
			}

			ch := brokertest.Channel(t, brokertest.Dial(t))
			if err := ch.ExchangeDelete(ex, false, false); err != nil {
				t.Fatal(err)
			}
			brokertest.DeleteQueue(t, q)
			brokertest.Eventually(t, 20*time.Second, "the redeclaration failing", func() bool { return log.Count("404") >= 2 })
			brokertest.Exchange(t, ex, "direct")
			if err := l.WaitReady(wait); err != nil {
				t.Fatalf("WaitReady = %v after the exchange came back; it logged:\n%s", err, log.String())
			}
			brokertest.Publish(t, q, amqp.Publishing{MessageId: "m"})
			brokertest.Eventually(t, 10*time.Second, "the message's second attempt", func() bool { return s.distinct() == 2 })
			if s.duplicates() != 0 {
				t.Errorf("attempts %v: the first ran more than once (the Retry's wait was cut short)", s.order)
			}
		})
	}
}
