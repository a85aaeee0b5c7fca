package publisher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqptable"
	"github.com/amqpretry/amqpretry/internal/amqpurl"
)

// Publisher publishes with mandatory set and returns after the broker's
// confirm. It is safe for concurrent use. Close it when done.
type Publisher struct {
	url      string // holds the password: never log it, log redacted
	redacted string
	username string
	cfg      config

	lanes    atomic.Pointer[laneSet]
	next     atomic.Uint32 // round robin over lanes
	frameMax atomic.Int64

	mu       sync.Mutex
	closed   bool          // no new publishes
	active   int           // publishes in progress
	idle     chan struct{} // closed when active reaches 0 after closed
	lastLoss error         // the latest connection problem, for error messages

	closing   chan struct{} // closed when the connection must go
	closeOnce sync.Once
	wg        sync.WaitGroup // the connection goroutine
}

// laneSet is an immutable snapshot of the usable lanes; changed is closed
// when it is replaced, waking publishes that found no lane.
type laneSet struct {
	lanes   []*lane
	changed chan struct{}
}

// New connects to the broker at url (amqp:// or amqps://) and opens its
// confirm channels. It fails at once if the URL or an option is invalid or
// the broker cannot be reached, so that a misconfiguration surfaces at
// startup; after that, the Publisher redials by itself.
func New(url string, opts ...Option) (*Publisher, error) {
	uri, err := amqpurl.Parse(url)
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	cfg := defaultConfig()
	for _, opt := range opts {
		opt(&cfg)
	}
	if len(cfg.errs) > 0 {
		return nil, errors.Join(cfg.errs...)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	p := &Publisher{
		url:      url,
		redacted: amqpurl.Redact(url),
		username: uri.Username,
		cfg:      cfg,
		idle:     make(chan struct{}),
		closing:  make(chan struct{}),
	}
	p.lanes.Store(&laneSet{changed: make(chan struct{})})

	conn, err := p.dial()
	if err != nil {
		return nil, fmt.Errorf("publisher: cannot connect to %s: %w", p.redacted, err)
	}
	died := make(chan *lane, cfg.channels)
	lanes, err := openLanes(conn, cfg.channels, died)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("publisher: cannot open confirm channels on %s: %w", p.redacted, err)
	}
	p.wg.Add(1)
	go p.run(conn, lanes, died)
	return p, nil
}

// Publish sends msg to exchange with routing key key and waits for the
// broker's confirm. It returns nil only when the broker acked the message.
//
// Headers are checked before anything is sent, and Go int values are widened
// to 64 bits. During an outage Publish waits for the redial and publishes
// then, until ctx ends; a message lost with its channel is published again.
// See the package documentation for what an error does and does not mean.
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	headers, err := amqptable.Normalize(msg.Headers)
	if err != nil {
		return fmt.Errorf("publisher: invalid message for exchange %q: %w", exchange, err)
	}
	msg.Headers = headers
	if !p.enter() {
		return ErrClosed
	}
	defer p.leave()

	exceptions := 0
	for {
		l, err := p.pickLane(ctx, exchange, key)
		if err != nil {
			return err
		}
		f, err := l.send(ctx, exchange, key, &msg)
		if err == nil {
			err = p.await(ctx, l, f)
		}
		var lost *errLaneLost
		switch {
		case err == nil:
			return nil
		case errors.As(err, &lost):
			// Lost with its channel: publish again, on a new channel if need be.
			// A channel exception may be this message's own doing: allow it once.
			if isChannelException(lost.cause) {
				if exceptions++; exceptions > 1 {
					return &ChannelError{Exchange: exchange, Code: lost.cause.Code, Reason: lost.cause.Reason}
				}
			}
		case ctx.Err() != nil:
			return &notConfirmedError{exchange: exchange, key: key, cause: ctx.Err()}
		default:
			return err
		}
	}
}

func (p *Publisher) await(ctx context.Context, l *lane, f *inflight) error {
	timer := time.NewTimer(p.cfg.confirmTimeout)
	defer timer.Stop()
	select {
	case err := <-f.result:
		return err
	case <-ctx.Done():
		l.forget(f.tag)
		return &notConfirmedError{exchange: f.exchange, key: f.key, cause: ctx.Err()}
	case <-timer.C:
		l.forget(f.tag)
		return &notConfirmedError{exchange: f.exchange, key: f.key, cause: fmt.Errorf("no confirm within %v (WithConfirmTimeout)", p.cfg.confirmTimeout)}
	}
}

// pickLane returns a live lane, waiting for one during an outage.
func (p *Publisher) pickLane(ctx context.Context, exchange, key string) (*lane, error) {
	for {
		set := p.lanes.Load()
		if n := len(set.lanes); n > 0 {
			start := int(p.next.Add(1))
			for i := range n {
				if l := set.lanes[(start+i)%n]; l.alive() {
					return l, nil
				}
			}
		}
		select {
		case <-set.changed:
		case <-ctx.Done():
			p.mu.Lock()
			loss := p.lastLoss
			p.mu.Unlock()
			return nil, &notConfirmedError{exchange: exchange, key: key, cause: fmt.Errorf("not connected: %w", ctx.Err()), lastLoss: loss}
		case <-p.closing:
			return nil, ErrClosed
		}
	}
}

// FrameMax is the frame size negotiated with the broker: a message's
// properties, headers included, must fit in one frame of this size.
func (p *Publisher) FrameMax() int { return int(p.frameMax.Load()) }

// Username is the user the Publisher logs in as. RabbitMQ refuses a message
// whose user-id property names anyone else.
func (p *Publisher) Username() string { return p.username }

// Close stops new publishes, waits up to the close timeout for those in
// flight to be confirmed, closes the connection and returns once every
// goroutine of the Publisher has ended. It can be called more than once.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		if p.active == 0 {
			close(p.idle)
		}
		p.mu.Unlock()
		timer := time.NewTimer(p.cfg.closeTimeout)
		defer timer.Stop()
		select {
		case <-p.idle:
		case <-timer.C:
		}
		close(p.closing)
	})
	p.wg.Wait()
	return nil
}

func (p *Publisher) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.active++
	return true
}

func (p *Publisher) leave() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active--
	if p.closed && p.active == 0 {
		close(p.idle)
	}
}

func (p *Publisher) dial() (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(p.cfg.name)
	conn, err := amqp.DialConfig(p.url, amqp.Config{
		Heartbeat:       p.cfg.heartbeat,
		TLSClientConfig: p.cfg.tls,
		Locale:          "en_US",
		Dial:            amqp.DefaultDial(p.cfg.dialTimeout),
		Properties:      props,
	})
	if err != nil {
		return nil, err
	}
	p.frameMax.Store(int64(conn.Config.FrameSize))
	return conn, nil
}

func openLanes(conn *amqp.Connection, n int, died chan<- *lane) ([]*lane, error) {
	lanes := make([]*lane, 0, n)
	for range n {
		l, err := openLane(conn, died)
		if err != nil {
			for _, l := range lanes {
				l.close()
			}
			return nil, err
		}
		lanes = append(lanes, l)
	}
	return lanes, nil
}

// run owns the connection: it serves one connection until it is lost, then
// redials with backoff, until Close.
func (p *Publisher) run(conn *amqp.Connection, lanes []*lane, died chan *lane) {
	defer p.wg.Done()
	redial := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second),
		backoff.WithMaxElapsedTime(0),
	)
	for {
		loss := p.serve(conn, lanes, died)
		if loss == nil {
			return // closing
		}
		p.noteLoss(loss)
		p.cfg.logger.Warn("publisher: connection lost; redialing", "url", p.redacted, "error", loss)
		if conn, lanes, died = p.redial(redial); conn == nil {
			return // closing
		}
		p.cfg.logger.Info("publisher: reconnected", "url", p.redacted)
	}
}

func (p *Publisher) redial(bo *backoff.ExponentialBackOff) (*amqp.Connection, []*lane, chan *lane) {
	bo.Reset()
	for {
		timer := time.NewTimer(bo.NextBackOff())
		select {
		case <-p.closing:
			timer.Stop()
			return nil, nil, nil
		case <-timer.C:
		}
		conn, err := p.dial()
		if err == nil {
			died := make(chan *lane, p.cfg.channels)
			lanes, lerr := openLanes(conn, p.cfg.channels, died)
			if lerr == nil {
				return conn, lanes, died
			}
			_ = conn.Close()
			err = lerr
		}
		p.noteLoss(err)
		p.cfg.logger.Warn("publisher: redial failed", "url", p.redacted, "error", err)
	}
}

func (p *Publisher) noteLoss(err error) {
	p.mu.Lock()
	p.lastLoss = err
	p.mu.Unlock()
}

// serve publishes through the lanes of one connection, replacing a lane whose
// channel the broker closed (a publish to a missing exchange, say). It
// returns the connection's loss, or nil when the Publisher is closing.
//
// Each lane reports its death once on died, which holds one report per lane,
// so a watcher never blocks on it even after serve has returned.
func (p *Publisher) serve(conn *amqp.Connection, lanes []*lane, died chan *lane) error {
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	p.install(lanes)
	defer func() {
		p.install(nil)
		for _, l := range lanes {
			l.close()
		}
	}()

	missing := 0
	var retry <-chan time.Time
	for {
		select {
		case <-p.closing:
			_ = conn.Close()
			return nil
		case err := <-connClosed:
			if err == nil {
				return errors.New("connection closed")
			}
			return err
		case dead := <-died:
			lanes = slices.DeleteFunc(lanes, func(l *lane) bool { return l == dead })
			missing++
			p.install(lanes)
		case <-retry:
			retry = nil
		}
		for ; missing > 0 && !conn.IsClosed(); missing-- {
			l, err := openLane(conn, died)
			if err != nil {
				p.cfg.logger.Warn("publisher: cannot reopen a confirm channel; retrying", "url", p.redacted, "error", err)
				if retry == nil {
					retry = time.After(time.Second)
				}
				break
			}
			lanes = append(lanes, l)
			p.install(lanes)
		}
	}
}

// install publishes a new snapshot of the usable lanes and wakes publishes
// waiting for one.
func (p *Publisher) install(lanes []*lane) {
	next := &laneSet{lanes: slices.Clone(lanes), changed: make(chan struct{})}
	old := p.lanes.Swap(next)
	close(old.changed)
}
