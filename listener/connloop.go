package listener

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/errtext"
	"github.com/amqpretry/amqpretry/internal/framecheck"
)

// connectionLoop dials, serves and redials: a Listener's Run and a Group's
// share it, each with its own serve.
type connectionLoop struct {
	cfg   *config
	who   string // "listener" or "listener group", for logs and errors
	attrs []any  // what the logs add: the queue, or the group's size
	// serve consumes on conn until ctx is done, the connection is lost or
	// something fatal happens; consumed: it got as far as consuming.
	serve func(conn *amqpconn.Conn) (consumed bool, err error)
	lost  func(err error) // a connection ended, or a dial failed
	// guarding is told that connections are guarded from now on (see
	// unreadable.go): the listeners reject what the guard marks.
	guarding func()
}

// run loops until ctx is done (it returns nil) or a dial or serve fails
// fatally (it returns that). serveCtx is what dials and sleeps end with:
// ctx, or for a Group a context it also cancels when one listener fails.
func (cl connectionLoop) run(ctx, serveCtx context.Context) error {
	cfg := cl.cfg
	redial := amqpconn.NewRedialer()
	dialer := amqpconn.NewDialer(cfg.conn)
	redacted := cfg.conn.Redacted()
	var lastAtOnce time.Time
	everConnected := false
	for {
		if ctx.Err() != nil || serveCtx.Err() != nil {
			return nil
		}
		conn, err := cl.dial(serveCtx, dialer)
		if err != nil && cfg.failFast && !everConnected && !isFatal(err) {
			err = &fatalError{fmt.Errorf("%w (WithFailFast: the first connection must succeed)", err)}
		}
		var served time.Duration
		if err == nil {
			everConnected = true
			cfg.logger.Info(cl.who+": connected", append(cl.attrs, "url", conn.RedactedURL)...)
			began := time.Now()
			var consumed bool
			consumed, err = cl.serve(conn)
			served = time.Since(began)
			if unparseable(err) && cfg.conn.Guard == nil {
				// A message whose headers amqp091-go cannot parse closed
				// the connection, and it would be first again on every
				// redial: read through the guard from now on.
				cfg.conn.Guard = framecheck.Guard
				dialer = amqpconn.NewDialer(cfg.conn)
				cl.guarding()
				cfg.logger.Error(cl.who+": a message's headers could not be parsed, and the client closed the connection on it "+
					"(amqp091-go reads header tables nested at most 32 deep and of at most 8,192 entries; RabbitMQ and other clients "+
					"allow more). Reading through a guard from now on: such a message is rejected without requeue, for the queue's "+
					"dead-letter exchange to take as it was sent, and the messages behind it flow (docs/limitations.md)",
					append(cl.attrs, "error", errtext.String(err))...)
				consumed = false // the next dial comes after the backoff's delay, not at once
			}
			if consumed {
				// Only a connection that got as far as consuming resets the
				// backoff: one whose declarations fail every time must not
				// be redialled at the initial pace for ever.
				redial.Reset()
			}
		}
		cl.lost(err)
		switch {
		case ctx.Err() != nil, err == nil:
			return nil // shutting down, whatever else happened meanwhile
		case isFatal(err):
			return err
		}
		if dialer.Several() && served >= time.Second && time.Since(lastAtOnce) >= amqpconn.AtOnceEvery {
			// A node of a cluster went away: the others are likely up, and
			// the dialer tries the lost one last. A connection that dies as
			// soon as it opens, or losses in quick succession, are paced
			// like failed dials instead.
			lastAtOnce = time.Now()
			cfg.logger.Warn(cl.who+": connection lost; dialing the other nodes", append(cl.attrs, "lost", conn.RedactedURL, "error", errtext.String(err))...)
			continue
		}
		delay := redial.Next()
		cfg.logger.Warn(cl.who+": connection problem; redialing", append(cl.attrs, "url", redacted, "error", errtext.String(err), "retry_in", delay)...)
		if amqpconn.Sleep(serveCtx, delay) != nil {
			return nil
		}
	}
}

// dial is dial, and tells lost, while a dial has been pending a second or
// more, that it has had no answer yet: a frozen broker that accepted the
// connection would otherwise leave LastConnectionError empty for the whole
// dial timeout.
func (cl connectionLoop) dial(ctx context.Context, dialer *amqpconn.Dialer) (*amqpconn.Conn, error) {
	began := time.Now()
	var mu sync.Mutex
	returned := false
	pending := time.AfterFunc(time.Second, func() {
		mu.Lock()
		defer mu.Unlock()
		if !returned { // else the dial's own outcome stands
			cl.lost(fmt.Errorf("%s: dialing %s: no answer yet after %v (WithDialTimeout %v)", cl.who, cl.cfg.conn.Redacted(),
				time.Since(began).Round(time.Second), cl.cfg.conn.DialTimeout))
		}
	})
	conn, err := dial(ctx, dialer, cl.who)
	mu.Lock()
	returned = true
	mu.Unlock()
	pending.Stop()
	return conn, err
}
