package publisher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqptable"
	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/internal/errtree"
	"github.com/amqpretry/amqpretry/internal/telemetry"
)

// Publisher publishes and returns after the broker's confirm. By default it
// sets mandatory, so that a message no queue takes is an error
// (ErrUnroutable), not a silent loss; WithMandatory(false) or
// WithMandatoryContext turn that off for events nobody may be bound to yet.
// It gives a message without a MessageId one (a random UUID), so that an
// idempotent consumer (outbox/inbox) can tell redeliveries apart. It is safe
// for concurrent use. Close it when done.
type Publisher struct {
	dialer   *amqpconn.Dialer // used by the connection goroutine only, after New
	redacted string
	username string
	cfg      config
	tel      *telemetry.Telemetry

	channels atomic.Pointer[channelSet]
	next     atomic.Uint32 // round robin over channels
	frameMax atomic.Int64
	soloSlot chan struct{} // held by the one publish on the solo channel

	// suspectRounds counts the confirm round trips spent, one after
	// another, finding which message caused a channel exception its text
	// pins on none; searching, the searches under way (tests read both).
	suspectRounds atomic.Int64
	searching     atomic.Int64

	// Async publishes (PublishAsync): room holds a token per publish
	// awaiting its outcome (WithMaxInFlight); completions calls their done
	// funcs; asyncLive counts those whose done has not returned yet, and
	// resends the goroutines sending again a message lost with its channel.
	room        chan struct{}
	completions *completer
	asyncLive   sync.WaitGroup
	resends     sync.WaitGroup

	mu       sync.Mutex
	closed   bool          // no new publishes
	active   int           // publishes in progress, sync and async
	idle     chan struct{} // closed when active reaches 0 after closed
	lastLoss error         // the latest connection problem, for error messages

	closing   context.Context    // done when the connection must go
	cancel    context.CancelFunc // makes closing done
	closeOnce sync.Once
	wg        sync.WaitGroup // the connection goroutine
}

// channelSet is an immutable snapshot of the usable confirm channels;
// changed is closed when it is replaced, waking publishes that found none.
//
// solo is a confirm channel of its own for a message whose channels keep
// closing under it, each exception pinned on another message: it is sent
// again there alone, one publish at a time (soloSlot), so that it is never
// sent more than a few times. (Messages lost with a channel whose exception
// is pinned on none of them are searched by the connection's isolator, on
// channels of its own: see isolate.go. Should the connection be going, they
// fall back to being sent alone here.)
type channelSet struct {
	channels []*confirmChannel
	solo     *confirmChannel
	blocked  bool // the broker sent connection.blocked: do not write
	changed  chan struct{}
}

// New connects to the broker at url (amqp:// or amqps://) and opens its
// confirm channels. It fails at once if the URL or an option is invalid or
// the broker cannot be reached, so that a misconfiguration surfaces at
// startup; after that, the Publisher redials by itself.
func New(url string, opts ...Option) (*Publisher, error) {
	cfg := defaultConfig()
	uri, err := amqpurl.Parse(url)
	if err != nil {
		cfg.errs = append(cfg.errs, fmt.Errorf("publisher: %w", err))
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	// url first, for WithURLsInOrder; each address once.
	urls := []string{url}
	for _, u := range cfg.conn.URLs {
		if !slices.Contains(urls, u) {
			urls = append(urls, u)
		}
	}
	cfg.conn.URLs = urls
	for _, other := range cfg.conn.URLs[1:] {
		switch ouri, err := amqpurl.Parse(other); {
		case err != nil:
			cfg.fail("WithURLs: %v", err)
		case ouri.Username != uri.Username:
			cfg.fail("WithURLs: %s logs in as %q and %s as %q: every address must log in as the same user",
				amqpurl.Redact(url), uri.Username, amqpurl.Redact(other), ouri.Username)
		}
	}
	for _, url := range cfg.conn.PlaintextDespiteTLS() {
		cfg.fail("WithTLS: %s is amqp://, which never uses TLS: use amqps:// (port 5671 by default) or drop WithTLS", url)
	}
	if len(cfg.errs) > 0 {
		return nil, errors.Join(cfg.errs...)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	p := &Publisher{
		dialer:   amqpconn.NewDialer(cfg.conn),
		redacted: cfg.conn.Redacted(),
		username: uri.Username,
		cfg:      cfg,
		idle:     make(chan struct{}),
		tel:      telemetry.New(cfg.telemetry),
		soloSlot: make(chan struct{}, 1),
		room:     make(chan struct{}, cfg.maxInFlight),
	}
	p.closing, p.cancel = context.WithCancel(context.Background())
	p.channels.Store(&channelSet{changed: make(chan struct{})})

	conn, err := p.dial()
	if err != nil {
		p.cancel()
		if url, refusal := amqpconn.LoginRefused(err); refusal != nil {
			return nil, fmt.Errorf("publisher: cannot connect to %s: %w (%w): %s", url, ErrLoginRefused, refusal, amqpconn.LoginFix(url, refusal))
		}
		return nil, fmt.Errorf("publisher: cannot connect to %w", err) // err names each address
	}
	died := make(chan *confirmChannel, cfg.channels+1)
	iso := p.newIsolator(conn.Connection)
	channels, err := openConfirmChannels(conn.Connection, cfg.channels, died, iso)
	if err != nil {
		conn.Abandon()
		iso.stop()
		p.cancel()
		return nil, fmt.Errorf("publisher: cannot open confirm channels on %s: %w", p.redacted, err)
	}
	cfg.logger.Info("publisher: connected", "url", conn.RedactedURL)
	p.wg.Add(1)
	go p.run(conn, channels, died, iso)
	p.completions = p.startCompleter()
	return p, nil
}

// Publish sends msg to exchange with routing key key and waits for the
// broker's confirm. It returns nil only when the broker acked the message.
//
// Headers are checked before anything is sent, and Go int values are widened
// to 64 bits. During an outage Publish waits for the redial and publishes
// then, until ctx ends; a message lost with its channel is published again.
// See the package documentation for what an error does and does not mean.
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) (err error) {
	began := time.Now()
	ctx, span := p.startSend(ctx, exchange, key, &msg)
	defer func() { p.endSend(ctx, span, began, exchange, err) }()
	if err := p.check(exchange, key, &msg); err != nil {
		return err
	}
	if !p.enter() {
		return ErrClosed
	}
	defer p.leave()

	return p.deliver(ctx, exchange, key, &msg, &tries{})
}

// tries is what one message's publishing has been through so far: the
// state that decides, after each attempt, whether to send it again.
type tries struct {
	exceptions   int  // channel exceptions it was lost in
	sendFailures int  // sends that failed in the socket
	sent         bool // a send went out: the broker may hold the message
	solo         bool // the attempt under way is (the next is to be) alone, on the solo channel
}

// deliver publishes msg until its outcome is known: the loop of picking a
// channel, sending and awaiting the confirm, sending again when the channel
// is lost. Publish runs it from the start; an async publish whose channel
// was lost runs it from where the first send left t.
func (p *Publisher) deliver(ctx context.Context, exchange, key string, msg *amqp.Publishing, t *tries) error {
	for {
		var cc *confirmChannel
		var err error
		if t.solo {
			cc, err = p.takeSolo(ctx, exchange, key)
			if err == nil {
				p.suspectRounds.Add(1)
			}
		} else {
			cc, err = p.pickChannel(ctx, exchange, key)
		}
		if err != nil {
			return t.noChannel(exchange, key, err)
		}
		f, err := cc.send(ctx, exchange, key, msg, p.mandatory(ctx), nil, nil)
		t.noteSend(f, err)
		if err == nil {
			err = p.await(ctx, cc, f)
		}
		if t.solo {
			<-p.soloSlot
		}
		if err == nil {
			return nil
		}
		if final, again := t.after(ctx, exchange, key, err); !again {
			return final
		}
		p.afterSendFailure(ctx, cc, err)
	}
}

// afterSendFailure waits, after a send that failed in the socket, until cc
// is closed: amqp091 closes the connection on a write error, but on a
// goroutine of its own, and until then every channel of it still takes
// sends that fail at once, each counted towards maxSendFailures.
func (p *Publisher) afterSendFailure(ctx context.Context, cc *confirmChannel, err error) {
	if lost, ok := errtree.As[*channelLostError](err); !ok || lost.sendErr == nil {
		return
	}
	select {
	case <-cc.done:
	case <-ctx.Done():
	case <-p.closing.Done():
	}
}

// noChannel is the outcome when no channel could be had.
func (t *tries) noChannel(exchange, key string, err error) error {
	if t.sent && err == ErrClosed {
		// Closed while a copy sent before was unconfirmed: it may be
		// stored, and a caller that publishes again on ErrNotConfirmed must
		// know that.
		return &notConfirmedError{exchange: exchange, key: key, cause: ErrClosed}
	}
	return err
}

// noteSend notes a send that went out (a write that failed may have gone out
// in part or whole).
func (t *tries) noteSend(f *inflight, err error) {
	if lost, ok := errtree.As[*channelLostError](err); f != nil || (ok && lost.sendErr != nil) {
		t.sent = true
	}
}

// after decides, from an attempt's error, whether to send the message again
// (again) or what the publish returns (final).
func (t *tries) after(ctx context.Context, exchange, key string, err error) (final error, again bool) {
	lost, isLost := errtree.As[*channelLostError](err) // errors.As's target would be allocated on every publish
	switch {
	case ctx.Err() != nil:
		return &notConfirmedError{exchange: exchange, key: key, cause: ctx.Err()}, false
	case isLost:
		// Lost with its channel: publish again, on a new channel if need
		// be. An exception on the solo channel, where this message was
		// alone, is this message's doing. One that the broker's text pins
		// on no message went to the isolator, which gives this message
		// its outcome; it comes back here unsearched only if the
		// connection was going, and is then sent again alone; a
		// message whose channels keep closing under it, each time blamed
		// on another, is sent alone too, so it is never sent more than a
		// few times.
		if isChannelException(lost.cause) {
			if t.solo {
				return &ChannelError{Exchange: exchange, Code: lost.cause.Code, Reason: lost.cause.Reason}, false
			}
			if t.exceptions++; !lost.attributed || t.exceptions >= maxAttributedExceptions {
				t.solo = true
			}
		}
		if lost.sendErr != nil {
			if t.sendFailures++; t.sendFailures > maxSendFailures {
				return &notConfirmedError{exchange: exchange, key: key, cause: lost.sendErr}, false
			}
		}
		return nil, true
	default:
		return err, false
	}
}

// How often one message may see its channel closed by exceptions the
// broker's text pins on other messages before it is sent alone, and how
// often a send may fail before Publish gives up on it.
const (
	maxAttributedExceptions = 3
	maxSendFailures         = 3
)

// ErrInvalidMessage: the message cannot be sent as it is; nothing was sent.
var ErrInvalidMessage = errors.New("publisher: invalid message")

// mandatory is whether a publish with ctx sets mandatory.
func (p *Publisher) mandatory(ctx context.Context) bool {
	if m, ok := ctx.Value(mandatoryKey{}).(bool); ok {
		return m
	}
	return p.cfg.mandatory
}

type mandatoryKey struct{}

// WithMandatoryContext returns a context whose publishes set mandatory (or
// not) whatever the Publisher's default (WithMandatory): recoverers and the
// outbox relay publish with mandatory=true this way, since a dead letter
// or an outbox row that no queue takes must be an error, never a loss.
func WithMandatoryContext(ctx context.Context, mandatory bool) context.Context {
	return context.WithValue(ctx, mandatoryKey{}, mandatory)
}

// newMessageID is a random (version 4) UUID.
func newMessageID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	// Written by hand: fmt.Sprintf took 7 of a publish's allocations.
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}

// check refuses what amqp091 cannot encode or the broker cannot take in a
// frame (either would close the whole connection, with every publish in
// flight on it), and what the broker would refuse by closing the channel,
// with every unconfirmed publish on it (an expiration that is not a number
// of milliseconds it takes, a user-id other than the login), and widens Go
// ints in the headers.
func (p *Publisher) check(exchange, key string, msg *amqp.Publishing) error {
	if msg.MessageId == "" {
		msg.MessageId = newMessageID()
	}
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w for exchange %q: %s", ErrInvalidMessage, exchange, fmt.Sprintf(format, args...))
	}
	if len(exchange) > amqptable.MaxShortString || len(key) > amqptable.MaxShortString {
		return invalid("exchange and routing key are limited to %d bytes, got %d and %d", amqptable.MaxShortString, len(exchange), len(key))
	}
	if err := amqptable.CheckShortStrings(*msg); err != nil {
		return invalid("%v", err)
	}
	if err := amqptable.CheckExpiration(msg.Expiration); err != nil {
		return invalid("%v", err)
	}
	if msg.UserId != "" && msg.UserId != p.username && !p.cfg.impersonate {
		return invalid("user-id %q is not %q, the user this Publisher logs in as: RabbitMQ refuses such a message by closing the channel, unless the user has the impersonator tag (then pass WithImpersonation)", msg.UserId, p.username)
	}
	headers, err := amqptable.Normalize(msg.Headers)
	if err != nil {
		return invalid("%v", err)
	}
	msg.Headers = headers
	if size, limit := amqptable.PropertiesSize(*msg), p.FrameMax()-amqptable.FrameOverhead; p.FrameMax() > 0 && size > limit {
		return invalid("its properties and headers take %d bytes, more than the %d one frame holds (frame_max %d): make the headers smaller", size, limit, p.FrameMax())
	}
	return nil
}

func (p *Publisher) await(ctx context.Context, cc *confirmChannel, f *inflight) error {
	// A context that ends first makes the confirm timeout moot: no timer
	// then (a recoverer's publish timeout, 30s by default as this one is).
	var expired <-chan time.Time
	if deadline, ok := ctx.Deadline(); !ok || time.Until(deadline) > p.cfg.confirmTimeout {
		timer := time.NewTimer(p.cfg.confirmTimeout)
		defer timer.Stop()
		expired = timer.C
	}
	select {
	case err := <-f.result:
		return err
	case <-ctx.Done():
		cc.forget(f.tag)
		f.abandoned.Store(true)
		return &notConfirmedError{exchange: f.exchange, key: f.key, cause: ctx.Err()}
	case <-expired:
		cc.forget(f.tag)
		f.abandoned.Store(true)
		return &notConfirmedError{exchange: f.exchange, key: f.key, cause: fmt.Errorf("no confirm within %v (WithConfirmTimeout)", p.cfg.confirmTimeout)}
	}
}

// takeSolo waits for the solo channel to be free and alive, and takes it;
// the caller gives it back by receiving from p.soloSlot.
func (p *Publisher) takeSolo(ctx context.Context, exchange, key string) (*confirmChannel, error) {
	select {
	case p.soloSlot <- struct{}{}:
	case <-ctx.Done():
		return nil, &notConfirmedError{exchange: exchange, key: key, cause: fmt.Errorf("waiting to be sent alone: %w", ctx.Err())}
	case <-p.closing.Done():
		return nil, ErrClosed
	}
	for {
		set := p.channels.Load()
		if cc := set.solo; cc != nil && cc.alive() && !set.blocked {
			return cc, nil
		}
		select {
		case <-set.changed:
		case <-ctx.Done():
			<-p.soloSlot
			p.mu.Lock()
			loss := p.lastLoss
			p.mu.Unlock()
			return nil, &notConfirmedError{exchange: exchange, key: key, cause: fmt.Errorf("not connected: %w", ctx.Err()), lastLoss: loss, notConnected: true}
		case <-p.closing.Done():
			<-p.soloSlot
			return nil, ErrClosed
		}
	}
}

// pickChannel returns a live confirm channel, waiting for one during an
// outage or while the broker blocks publishing (a memory or disk alarm).
func (p *Publisher) pickChannel(ctx context.Context, exchange, key string) (*confirmChannel, error) {
	for {
		set := p.channels.Load()
		if cc := p.channelOf(set); cc != nil {
			return cc, nil
		}
		select {
		case <-set.changed:
		case <-ctx.Done():
			p.mu.Lock()
			loss := p.lastLoss
			p.mu.Unlock()
			return nil, &notConfirmedError{exchange: exchange, key: key, cause: fmt.Errorf("not connected: %w", ctx.Err()), lastLoss: loss, notConnected: true}
		case <-p.closing.Done():
			return nil, ErrClosed
		}
	}
}

// channelNow is pickChannel without the wait: a live channel, or nil.
func (p *Publisher) channelNow() *confirmChannel { return p.channelOf(p.channels.Load()) }

// channelOf returns a live channel of set, the next in turn, or nil.
func (p *Publisher) channelOf(set *channelSet) *confirmChannel {
	if n := len(set.channels); n > 0 && !set.blocked {
		start := int(p.next.Add(1))
		for i := range n {
			if cc := set.channels[(start+i)%n]; cc.alive() {
				return cc
			}
		}
	}
	return nil
}

// MaxInFlight is WithMaxInFlight's bound: how many async publishes may
// await their outcome at once. A caller that keeps many in flight (the
// outbox relay) keeps within it, so that its own limit, not the wait for
// room, decides when a publish starts.
func (p *Publisher) MaxInFlight() int { return cap(p.room) }

// FrameMax is the frame size negotiated with the broker: a message's
// properties, headers included, must fit in one frame of this size.
func (p *Publisher) FrameMax() int { return int(p.frameMax.Load()) }

// Username is the user the Publisher logs in as. RabbitMQ refuses a message
// whose user-id property names anyone else, and so does Publish, unless
// WithImpersonation says the user may.
func (p *Publisher) Username() string { return p.username }

// Close stops new publishes, waits up to the close timeout for those in
// flight to be confirmed, closes the connection and returns once every
// goroutine of the Publisher has ended and every async publish's done has
// been called (those still unconfirmed at the close timeout with an error
// matching ErrNotConfirmed and ErrClosed). It can be called more than once.
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
		p.cancel()
		// With the connection gone, every async publish left gets its
		// outcome: its channel died, and sending again finds the
		// Publisher closed.
		p.wg.Wait()
		p.asyncLive.Wait()
		p.resends.Wait()
		p.completions.stop()
	})
	p.wg.Wait()
	p.completions.wait()
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

// enterAsync is enter for an async publish, which Close waits for until its
// done has returned.
func (p *Publisher) enterAsync() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.active++
	p.asyncLive.Add(1)
	return true
}

func (p *Publisher) leaveAsync() {
	p.leave()
	p.asyncLive.Done()
}

func (p *Publisher) dial() (*amqpconn.Conn, error) {
	conn, err := p.dialer.Dial(p.closing)
	if err != nil {
		return nil, err
	}
	p.frameMax.Store(int64(conn.Config.FrameSize))
	return conn, nil
}

// openConfirmChannels opens n shared confirm channels, whose unpinned
// exceptions iso searches, and, last, the solo one.
func openConfirmChannels(conn *amqp.Connection, n int, died chan<- *confirmChannel, iso *isolator) ([]*confirmChannel, error) {
	channels := make([]*confirmChannel, 0, n+1)
	for i := range n + 1 {
		isolate := iso.start
		if i == n {
			isolate = nil
		}
		cc, err := openConfirmChannel(conn, died, isolate)
		if err != nil {
			for _, cc := range channels {
				cc.close()
			}
			return nil, err
		}
		channels = append(channels, cc)
	}
	return channels, nil
}

// run owns the connection: it serves one connection until it is lost, then
// redials with backoff, until Close.
func (p *Publisher) run(conn *amqpconn.Conn, channels []*confirmChannel, died chan *confirmChannel, iso *isolator) {
	defer p.wg.Done()
	redial := amqpconn.NewRedialer()
	var lastAtOnce time.Time
	for {
		began := time.Now()
		loss := p.serve(conn, channels, died, iso)
		if loss == nil {
			return // closing
		}
		p.noteLoss(loss)
		p.cfg.logger.Warn("publisher: connection lost; redialing", "url", conn.RedactedURL, "error", loss)
		// With the nodes of a cluster, the others are likely up: dial them
		// at once, the lost one last. A connection that died as soon as it
		// opened, or losses in quick succession, are paced like failed dials.
		atOnce := p.dialer.Several() && time.Since(began) >= time.Second && time.Since(lastAtOnce) >= amqpconn.AtOnceEvery
		if atOnce {
			lastAtOnce = time.Now()
		}
		if conn, channels, died, iso = p.redial(redial, atOnce); conn == nil {
			return // closing
		}
		p.cfg.logger.Info("publisher: reconnected", "url", conn.RedactedURL)
	}
}

func (p *Publisher) redial(redial *amqpconn.Redialer, atOnce bool) (*amqpconn.Conn, []*confirmChannel, chan *confirmChannel, *isolator) {
	redial.Reset()
	for {
		if !atOnce && amqpconn.Sleep(p.closing, redial.Next()) != nil {
			return nil, nil, nil, nil
		}
		atOnce = false
		conn, err := p.dial()
		if err == nil {
			died := make(chan *confirmChannel, p.cfg.channels+1)
			iso := p.newIsolator(conn.Connection)
			channels, lerr := openConfirmChannels(conn.Connection, p.cfg.channels, died, iso)
			if lerr == nil {
				return conn, channels, died, iso
			}
			conn.Abandon()
			iso.stop()
			err = lerr
		}
		if p.closing.Err() != nil {
			return nil, nil, nil, nil // Close cut the dial short: no failure to report
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

// serve publishes through the confirm channels of one connection, replacing
// one that the broker closed (a publish to a missing exchange, say). It
// returns the connection's loss, or nil when the Publisher is closing.
// channels holds the shared channels and, last, the solo one; iso searches
// the shared channels' unpinned exceptions, and serve stops it, waiting for
// its searches, before it returns.
//
// Each confirm channel reports its death once on died, which holds one
// report per channel, so a watcher never blocks on it even after serve has
// returned.
func (p *Publisher) serve(conn *amqpconn.Conn, channels []*confirmChannel, died chan *confirmChannel, iso *isolator) error {
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	blockings := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	blocked := false
	solo := channels[len(channels)-1]
	channels = channels[:len(channels)-1]
	p.install(channels, solo, blocked)
	defer func() {
		// A write stuck in the socket would keep amqp091's shutdown, and so
		// the channels, from ever finishing: close the socket first.
		conn.Abandon()
		p.install(nil, nil, false)
		for _, cc := range channels {
			cc.close()
		}
		if solo != nil {
			solo.close()
		}
		iso.stop()
	}()
	watchdog := time.NewTicker(time.Second)
	defer watchdog.Stop()

	missing := 0
	var retry <-chan time.Time
	for {
		select {
		case <-p.closing.Done():
			_ = conn.CloseDeadline(time.Now().Add(2 * time.Second))
			return nil
		case err := <-connClosed:
			if err == nil {
				return errors.New("connection closed")
			}
			return err
		case b := <-blockings:
			blocked = b.Active
			p.cfg.logger.Warn("publisher: the broker blocked or unblocked publishing", "url", p.redacted, "blocked", b.Active, "reason", b.Reason)
			p.install(channels, solo, blocked)
		case now := <-watchdog.C:
			// A send stuck in a socket write for two heartbeats means the
			// connection is dead in all but name: close it, which frees the
			// writer, and redial.
			// So does one stuck for a tick whose caller has stopped
			// waiting: amqp091 would hold that caller until the stall
			// detector fires, far past its context (a shutdown timeout).
			stall := time.Duration(0)
			abandoned := false
			if solo != nil {
				stall = solo.stalledFor(now)
				abandoned = solo.abandonedSend(now, time.Second)
			}
			for _, cc := range channels {
				stall = max(stall, cc.stalledFor(now))
				abandoned = abandoned || cc.abandonedSend(now, time.Second)
			}
			if (stall > 2*p.cfg.conn.Heartbeat || abandoned) && !blocked {
				p.cfg.logger.Warn("publisher: a write has been stuck; closing the connection", "url", p.redacted, "stuck_for", stall, "caller_gave_up", abandoned)
				return fmt.Errorf("a write was stuck for %v", stall)
			}
		case dead := <-died:
			if dead == solo {
				solo = nil
			} else {
				channels = slices.DeleteFunc(channels, func(cc *confirmChannel) bool { return cc == dead })
				missing++
			}
			p.install(channels, solo, blocked)
		case <-retry:
			retry = nil
		}
		for (solo == nil || missing > 0) && !conn.IsClosed() {
			isolate := iso.start
			if solo == nil {
				isolate = nil
			}
			cc, err := openConfirmChannel(conn.Connection, died, isolate)
			if err != nil {
				p.cfg.logger.Warn("publisher: cannot reopen a confirm channel; retrying", "url", p.redacted, "error", err)
				if retry == nil {
					retry = time.After(time.Second)
				}
				break
			}
			if solo == nil {
				solo = cc
			} else {
				channels = append(channels, cc)
				missing--
			}
			p.install(channels, solo, blocked)
		}
	}
}

// install publishes a new snapshot of the usable channels and wakes publishes
// waiting for one.
func (p *Publisher) install(channels []*confirmChannel, solo *confirmChannel, blocked bool) {
	next := &channelSet{channels: slices.Clone(channels), solo: solo, blocked: blocked, changed: make(chan struct{})}
	old := p.channels.Swap(next)
	close(old.changed)
}
