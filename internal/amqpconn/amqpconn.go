package amqpconn

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Conn is an AMQP connection and its socket.
type Conn struct {
	*amqp.Connection

	mu  sync.Mutex
	raw net.Conn
}

// Dial connects like amqp.DialConfig, with dialTimeout for the TCP connect
// and the handshake; config.Dial is replaced.
func Dial(url string, config amqp.Config, dialTimeout time.Duration) (*Conn, error) {
	return DialContext(context.Background(), url, config, dialTimeout)
}

// DialContext is Dial that gives up as soon as ctx ends, handshake included.
func DialContext(ctx context.Context, url string, config amqp.Config, dialTimeout time.Duration) (*Conn, error) {
	c := &Conn{}
	config.Dial = func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: dialTimeout}
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// As amqp091's DefaultDial: a deadline for the TLS and AMQP handshakes,
		// cleared once the connection is open.
		if err := raw.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
			_ = raw.Close()
			return nil, err
		}
		c.mu.Lock()
		c.raw = raw
		c.mu.Unlock()
		return raw, nil
	}
	// A context that ends during the handshake closes the socket under it.
	abandoned := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(abandoned)
		c.Abandon()
	})
	conn, err := amqp.DialConfig(url, config)
	if !stop() {
		<-abandoned // the AfterFunc ran: wait for it, so no goroutine outlives the call
		if err == nil {
			_ = conn.Close()
			err = ctx.Err()
		}
	}
	if err != nil {
		c.Abandon() // a failed handshake may leave the socket open
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (while dialing: %v)", ctx.Err(), err)
		}
		return nil, err
	}
	c.Connection = conn
	return c, nil
}

// Abandon closes the socket under the connection at once, unblocking any
// write stuck in it; amqp091 then shuts the connection down. Safe to call
// more than once and after Close.
func (c *Conn) Abandon() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.raw != nil {
		_ = c.raw.Close()
	}
}
