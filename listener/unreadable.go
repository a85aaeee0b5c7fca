package listener

import (
	"errors"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
)

// A header table amqp091-go v1.16.0 cannot parse (nested more than 32 deep,
// more than 8,192 entries: RabbitMQ and pika allow both) makes it close the
// whole connection as the message arrives, and the message is first again
// on the next connection: the queue is blocked, and a quorum queue counts a
// delivery of everything in flight at every loss. After the first such
// loss the listener dials through framecheck's guard, which replaces the
// table it cannot read by one header (amqphdr.UnreadableHeaders, saying
// why); the listener rejects that delivery without requeue, and the queue's
// dead-letter exchange gets the message as the broker holds it, headers
// and all (or the broker drops it, if the queue has none). The handler never
// sees it: its headers are not the message's.

// unparseable reports whether err is a connection that amqp091-go closed
// because it could not parse a frame from the broker (not one that broke).
func unparseable(err error) bool {
	var e *amqp.Error
	if !errors.As(err, &e) || e.Code != amqp.FrameError || e.Server {
		return false
	}
	for _, parse := range []*amqp.Error{amqp.ErrSyntax, amqp.ErrFieldType, amqp.ErrFrame} {
		if strings.Contains(e.Reason, parse.Reason) {
			return true
		}
	}
	return false
}

// unreadable reports whether the guard replaced d's headers.
func (l *Listener) unreadable(d *amqp.Delivery) bool {
	if !l.guarded.Load() || d.Headers == nil {
		return false
	}
	_, marked := d.Headers[amqphdr.UnreadableHeaders]
	return marked
}

// rejectUnreadable rejects d without requeue and says why.
func (c *consumer) rejectUnreadable(d *amqp.Delivery) {
	l := c.sv.l
	if err := d.Reject(false); err != nil {
		return // the channel is gone: the broker has it back
	}
	l.stats.rejected.Add(1)
	l.stats.failed.Add(1)
	l.cfg.logger.Error("listener: rejected a message without requeue: the client cannot read its headers; the queue's dead-letter "+
		"exchange gets it as it was sent (the broker drops it if the queue has none)",
		"queue", l.queue, "message_id", d.MessageId, "delivery_tag", d.DeliveryTag, "why", d.Headers[amqphdr.UnreadableHeaders])
}
