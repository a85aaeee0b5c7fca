package publisher_test

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/publisher"
)

// An event to an exchange nobody is bound to yet: with mandatory (the
// default) Publish returns ErrUnroutable; WithMandatory(false) publishes it
// and returns nil once the broker confirms (it drops it); the per-call
// context overrides either default.
func TestMandatoryIsSelectable(t *testing.T) {
	ex := brokertest.Name(t, "events")
	brokertest.Exchange(t, ex, "topic")
	ctx := ctxTimeout(t, 10*time.Second)
	strict := newPublisher(t, brokertest.URL())
	loose := newPublisher(t, brokertest.URL(), publisher.WithMandatory(false))
	tests := []struct {
		name       string
		p          *publisher.Publisher
		ctx        context.Context
		unroutable bool
	}{
		{"default", strict, ctx, true},
		{"WithMandatory(false)", loose, ctx, false},
		{"per call off", strict, publisher.WithMandatoryContext(ctx, false), false},
		{"per call on", loose, publisher.WithMandatoryContext(ctx, true), true},
	}
	for _, tt := range tests {
		err := tt.p.Publish(tt.ctx, ex, "order.created", amqp.Publishing{Body: []byte("{}")})
		if got := errors.Is(err, publisher.ErrUnroutable); got != tt.unroutable || (!tt.unroutable && err != nil) {
			t.Errorf("%s: Publish = %v, want unroutable: %v", tt.name, err, tt.unroutable)
		}
	}
}

var uuid = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// A message published without a MessageId gets one (a random UUID), so an
// idempotent consumer can tell its redeliveries apart; one given is kept.
func TestPublishGivesAMessageID(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, brokertest.URL())
	ctx := ctxTimeout(t, 10*time.Second)
	for _, id := range []string{"", "", "invoice-7"} {
		if err := p.Publish(ctx, "", q, amqp.Publishing{MessageId: id, Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	var ids []string
	for range 3 {
		d, ok := brokertest.Get(t, ch, q)
		if !ok {
			t.Fatal("a message is missing")
		}
		ids = append(ids, d.MessageId)
	}
	if !uuid.MatchString(ids[0]) || !uuid.MatchString(ids[1]) || ids[0] == ids[1] || ids[2] != "invoice-7" {
		t.Errorf("message ids %q: want two distinct UUIDs and invoice-7", ids)
	}
}
