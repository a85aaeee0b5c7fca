package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// defaultURL is the broker scripts/broker.sh starts.
const defaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// defaultRetryURL is the RabbitMQ 4.3 broker scripts/rabbit4.sh 4.3 starts,
// and defaultRetryCtl its rabbitmqctl, from bench/ (where make bench runs).
const (
	defaultRetryURL = "amqp://guest:guest@127.0.0.1:5674/"
	defaultRetryCtl = "../scripts/rabbit4.sh 4.3 ctl"
)

// fillBatch is how many messages fill publishes before it waits for a
// confirm: amqp091 scans every outstanding confirm on each multiple ack, so
// one huge batch would be slow, and waiting after each message slower still.
const fillBatch = 500

// broker is the program's own connection for setting up and inspecting
// queues. Consumers under test never use it: each variant dials its own.
type broker struct {
	url  string
	conn *amqp.Connection
}

// dialBroker connects, or says plainly which broker did not answer and how
// to get one.
func dialBroker(rawURL string) (*broker, error) {
	conn, err := amqp.DialConfig(rawURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("no RabbitMQ broker at %s: %w (start one with scripts/broker.sh, or set AMQP_URL)", redact(rawURL), err)
	}
	return &broker{url: rawURL, conn: conn}, nil
}

func (b *broker) Close() error { return b.conn.Close() }

// redact hides the password of an AMQP URL for messages.
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// serverInfo is what the broker says about itself at connection time.
func (b *broker) serverInfo() (product, version, platform string) {
	get := func(k string) string {
		s, _ := b.conn.Properties[k].(string)
		return s
	}
	return get("product"), get("version"), get("platform")
}

// uniqueName returns a queue name no other run uses, so that a crashed run's
// leftovers never meet a later one.
func uniqueName(kind string) string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return "amqpretry-bench." + kind + "." + hex.EncodeToString(r[:])
}

// withChannel runs f on a fresh channel: a failed operation closes its
// channel, and the next one must not inherit that.
func (b *broker) withChannel(f func(ch *amqp.Channel) error) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	return f(ch)
}

// declare creates a durable classic queue.
func (b *broker) declare(name string) error {
	return b.withChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, nil)
		return err
	})
}

// remove deletes a queue, whatever it still holds.
func (b *broker) remove(name string) error {
	return b.withChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(name, false, false, false)
		return err
	})
}

// queues declares fresh queues and returns a function that deletes them all.
func (b *broker) queues(names ...string) (cleanup func() error, err error) {
	var declared []string
	cleanup = func() error {
		var errs []error
		for _, q := range declared {
			errs = append(errs, b.remove(q))
		}
		return errors.Join(errs...)
	}
	for _, q := range names {
		if err := b.declare(q); err != nil {
			return nil, errors.Join(fmt.Errorf("declare %s: %w", q, err), cleanup())
		}
		declared = append(declared, q)
	}
	return cleanup, nil
}

// inspect reports a queue's ready messages and consumers.
func (b *broker) inspect(name string) (amqp.Queue, error) {
	var q amqp.Queue
	err := b.withChannel(func(ch *amqp.Channel) (err error) {
		q, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
		return err
	})
	return q, err
}

// fill publishes n small transient messages to queue q and waits until the
// broker has confirmed every one: it is set-up, never measured.
func (b *broker) fill(ctx context.Context, q string, n int) error {
	return b.publishN(ctx, q, n, false)
}

// fillIDs is fill with message ids, the decimal numbers 0 to n-1.
func (b *broker) fillIDs(ctx context.Context, q string, n int) error {
	return b.publishN(ctx, q, n, true)
}

func (b *broker) publishN(ctx context.Context, q string, n int, ids bool) error {
	return b.withChannel(func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		body := make([]byte, 128)
		for sent := 0; sent < n; {
			var last *amqp.DeferredConfirmation
			for end := min(sent+fillBatch, n); sent < end; sent++ {
				msg := amqp.Publishing{Body: body}
				if ids {
					msg.MessageId = strconv.Itoa(sent)
				}
				dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, msg)
				if err != nil {
					return fmt.Errorf("fill %s: %w", q, err)
				}
				last = dc
			}
			// Confirms arrive in order: the last one acked means all were.
			ok, err := last.WaitContext(ctx)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("fill %s: the broker nacked a message", q)
			}
		}
		return nil
	})
}

// waitDepth polls until queue q holds want ready messages: a copy confirmed
// by the broker is in the queue, so this only guards against miscounting.
func (b *broker) waitDepth(ctx context.Context, q string, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		info, err := b.inspect(q)
		if err != nil {
			return err
		}
		if info.Messages == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queue %s holds %d messages, want %d", q, info.Messages, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
