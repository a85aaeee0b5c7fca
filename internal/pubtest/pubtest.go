// Package pubtest is a publisher for tests of what recoverers publish: it
// records every message instead of sending it, and fails when told to, so
// header building and routing are tested without a broker. What only a broker
// can show (confirms, returns, frame limits it enforces) stays in the broker
// suite.
package pubtest

import (
	"context"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Published is one message a Publisher was given.
type Published struct {
	Exchange, Key string
	Msg           amqp.Publishing
}

// Publisher records what it is asked to publish. Its zero value works:
// frame_max 131072, user "guest", every publish confirmed.
type Publisher struct {
	Frame int    // frame_max it reports; 0 means 131072
	User  string // user it reports; "" means guest
	Err   error  // returned by every Publish when set

	mu   sync.Mutex
	sent []Published
}

// Publish records msg, or returns Err.
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.Err != nil {
		return p.Err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = append(p.sent, Published{Exchange: exchange, Key: key, Msg: msg})
	return nil
}

// FrameMax is the frame size the publisher reports.
func (p *Publisher) FrameMax() int {
	if p.Frame == 0 {
		return 131072
	}
	return p.Frame
}

// Username is the user the publisher reports.
func (p *Publisher) Username() string {
	if p.User == "" {
		return "guest"
	}
	return p.User
}

// Sent returns what was published so far, in order.
func (p *Publisher) Sent() []Published {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Published(nil), p.sent...)
}
