package brokertest

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// HeadersTooDeep is a header value amqp091-go v1.16.0 cannot read: tables
// nested 33 deep, which RabbitMQ accepts and pika sends. A frame that
// carries it makes amqp091-go close the whole connection.
func HeadersTooDeep() amqp.Table {
	v := amqp.Table{"leaf": "x"}
	for range 32 {
		v = amqp.Table{"d": v}
	}
	return v
}

// BrokerDeadLetter publishes a message (id "m") to a topic exchange with
// key and has the broker dead-letter it into a DLQ, as a consumer's reject
// does (pika's, recoverer.Reject(), a Permanent error without a recoverer):
// it carries where it was first published only in x-death, and the work
// queue dead-letters it with the routing key "dead". The queues and
// exchanges are the test's (deleted when it ends).
func BrokerDeadLetter(t *testing.T, key string) (work, ex, dlq string) {
	t.Helper()
	work, ex, dlq = Name(t, "work"), Name(t, "orders"), Name(t, "dlq")
	dlxEx := Name(t, "dlx")
	Exchange(t, ex, "topic")
	Exchange(t, dlxEx, "fanout")
	Queue(t, work, amqp.Table{"x-dead-letter-exchange": dlxEx, "x-dead-letter-routing-key": "dead"})
	Queue(t, dlq, nil)
	Bind(t, work, ex, "order.*")
	Bind(t, dlq, dlxEx, "")
	ch := Channel(t, Dial(t))
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	conf, err := ch.PublishWithDeferredConfirm(ex, key, true, false, amqp.Publishing{MessageId: "m", Body: []byte("order")})
	if err != nil || !conf.Wait() {
		t.Fatalf("publish: %v", err)
	}
	Eventually(t, 5*time.Second, "the message on the work queue", func() bool { return Depth(t, work) == 1 })
	d, ok, err := ch.Get(work, false)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	_ = d.Reject(false)
	Eventually(t, 5*time.Second, "the dead letter on the DLQ", func() bool { return Depth(t, dlq) == 1 })
	return work, ex, dlq
}
