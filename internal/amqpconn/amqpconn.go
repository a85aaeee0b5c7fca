package amqpconn

import (
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
	c := &Conn{}
	base := amqp.DefaultDial(dialTimeout)
	config.Dial = func(network, addr string) (net.Conn, error) {
		raw, err := base(network, addr)
		if err == nil {
			c.mu.Lock()
			c.raw = raw
			c.mu.Unlock()
		}
		return raw, err
	}
	conn, err := amqp.DialConfig(url, config)
	if err != nil {
		c.Abandon() // a failed handshake may leave the socket open
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
