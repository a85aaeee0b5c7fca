package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/deadletter"
	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/internal/framecheck"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// DefaultLimit is how many messages a look takes from a queue at most.
const DefaultLimit = 10000

// Config is what a Console shows and how it is reached. New checks it.
type Config struct {
	// URLs are the broker's addresses (a cluster's nodes), amqp:// or
	// amqps://.
	URLs []string
	// Queues are the dead-letter queues shown.
	Queues []string
	// QueuesMatching adds every queue whose name it matches, listed through
	// RabbitMQ's management API at ManagementURL at each overview.
	QueuesMatching *regexp.Regexp
	// ManagementURL is the management API's base URL; "" derives it from
	// the first of URLs (http://host:15672/, https://host:15671/ for
	// amqps://, with its user and password).
	ManagementURL string
	// Limit bounds a look: at most this many messages per queue (0:
	// DefaultLimit).
	Limit int
	// HeaderPrefix is the recoverer's header prefix ("":
	// recoverer.DefaultHeaderPrefix).
	HeaderPrefix string
	// ArchiveType is the type a queue's archive is declared with when a
	// delete finds none: "classic" (""), or "quorum" for a quorum DLQ's.
	// AMQP 0-9-1 does not tell a client a queue's type; an archive declared
	// beforehand is used as it is.
	ArchiveType string
	// ReadOnly hides every action and refuses it with 403.
	ReadOnly bool
	// Tokens are the secrets that buy a session, by the name the audit log
	// records (who). At least one; each at least MinTokenLength bytes.
	Tokens map[string]string
	// Hosts are further names the console may be reached as (a DNS name,
	// a reverse proxy's), as host or host:port; the address it listens on
	// is always allowed, and for a loopback address localhost too.
	Hosts []string
	// SecureCookie marks the session cookie Secure: set it when the
	// console is served over HTTPS.
	SecureCookie bool
	// Audit receives one JSON line per action. Required.
	Audit io.Writer
	// Outbox, when set, adds the outbox's failed rows, with their retry.
	Outbox *outbox.Outbox
	// Secrets are further strings never to show (a DSN's password).
	Secrets []string
	// Log receives what the console does and refuses; nil logs nothing.
	Log *slog.Logger
}

// MinTokenLength is the shortest token Config accepts.
const MinTokenLength = 16

// Console is the web console. Handler serves it; Close releases its
// connections.
type Console struct {
	cfg     Config
	prefix  string
	limit   int
	log     *slog.Logger
	secrets []string
	lister  *queueLister

	auth   *authenticator
	audit  *auditLog
	render *renderer

	connMu sync.Mutex // guards conn, pub and closed
	conn   *amqpconn.Conn
	pub    *publisher.Publisher
	closed bool

	mu        sync.Mutex // guards what follows
	queues    map[string]*queueState
	seq       int // of snapshots
	baseCtx   context.Context
	results   map[int]*result
	resultSeq int
}

// queueState is what the console holds of one queue between requests: the
// last snapshot (no message: they were handed back), and the right to look
// or act on it.
type queueState struct {
	busy chan struct{} // one token: held while a look or an action runs
	snap *Snapshot     // Console.mu
}

// New checks cfg and returns a Console. It does not connect: the first
// page does.
func New(cfg Config) (*Console, error) {
	if len(cfg.URLs) == 0 {
		return nil, errors.New("console: Config.URLs is empty: give the broker's URL")
	}
	for _, u := range cfg.URLs {
		if _, err := amqpurl.Parse(u); err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
	}
	if len(cfg.Queues) == 0 && cfg.QueuesMatching == nil {
		return nil, errors.New("console: no queue: give Config.Queues or Config.QueuesMatching")
	}
	if cfg.Limit < 0 {
		return nil, fmt.Errorf("console: Config.Limit %d: a look takes 1 or more messages", cfg.Limit)
	}
	if len(cfg.Tokens) == 0 {
		return nil, errors.New("console: Config.Tokens is empty: every page needs a token")
	}
	for name, token := range cfg.Tokens {
		if name == "" || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return nil, fmt.Errorf("console: token name %q: want a printable, non-empty name", name)
		}
		if len(token) < MinTokenLength {
			return nil, fmt.Errorf("console: token %q is %d bytes long: want at least %d", name, len(token), MinTokenLength)
		}
	}
	if cfg.Audit == nil {
		return nil, errors.New("console: Config.Audit is nil: every action is recorded")
	}
	c := &Console{
		cfg:     cfg,
		prefix:  cfg.HeaderPrefix,
		limit:   cfg.Limit,
		log:     cfg.Log,
		queues:  make(map[string]*queueState),
		results: make(map[int]*result),
	}
	if c.prefix == "" {
		c.prefix = recoverer.DefaultHeaderPrefix
	}
	if c.limit == 0 {
		c.limit = DefaultLimit
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	for _, u := range cfg.URLs {
		if uri, err := amqpurl.Parse(u); err == nil && uri.Password != "" {
			c.secrets = append(c.secrets, uri.Password, url.QueryEscape(uri.Password), url.PathEscape(uri.Password))
		}
	}
	for _, s := range cfg.Secrets {
		if s != "" {
			c.secrets = append(c.secrets, s)
		}
	}
	if cfg.QueuesMatching != nil {
		lister, err := newQueueLister(cfg.ManagementURL, cfg.URLs[0])
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		c.lister = lister
		if lister.password != "" {
			c.secrets = append(c.secrets, lister.password)
		}
	}
	c.auth = newAuthenticator(cfg.Tokens, cfg.SecureCookie)
	c.audit = &auditLog{w: cfg.Audit}
	render, err := newRenderer()
	if err != nil {
		return nil, err
	}
	c.render = render
	return c, nil
}

// Close closes the console's broker connections. Safe to call twice.
func (c *Console) Close() error {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	c.closed = true
	var errs []error
	if c.pub != nil {
		errs = append(errs, c.pub.Close())
		c.pub = nil
	}
	if c.conn != nil && !c.conn.IsClosed() {
		errs = append(errs, c.conn.Close())
	}
	c.conn = nil
	return errors.Join(errs...)
}

// errClosed is what an operation after Close returns.
var errClosed = errors.New("console: closed")

// channel opens a channel on the console's connection, dialing it first if
// it is not open. Each look and each action has a channel of its own, so a
// channel error (a missing queue) ends only that one.
func (c *Console) channel(ctx context.Context) (*amqp.Channel, amqpconn.ServerVersion, error) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.closed {
		return nil, amqpconn.ServerVersion{}, errClosed
	}
	if c.conn == nil || c.conn.IsClosed() {
		// Through the guard: a dead letter amqp091-go cannot parse (headers
		// nested too deep, as other clients send) must not close the
		// connection under every look (docs/limitations.md).
		conn, err := amqpconn.Dial(ctx, amqpconn.Config{URLs: c.cfg.URLs, DialTimeout: 10 * time.Second, Name: "amqpretry console", Guard: framecheck.Guard})
		if err != nil {
			return nil, amqpconn.ServerVersion{}, fmt.Errorf("connect to %w", err) // err names the address, password hidden
		}
		c.conn = conn
	}
	ch, err := c.conn.Channel()
	if err != nil {
		return nil, amqpconn.ServerVersion{}, fmt.Errorf("open a channel on %s: %w", c.conn.RedactedURL, err)
	}
	return ch, amqpconn.VersionOf(c.conn.Properties), nil
}

// publisher is the console's publisher for replays, made at the first.
func (c *Console) publisher() (*publisher.Publisher, error) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.closed {
		return nil, errClosed
	}
	if c.pub == nil {
		pub, err := publisher.New(c.cfg.URLs[0], publisher.WithURLs(c.cfg.URLs...),
			publisher.WithConnectionName("amqpretry console replay"), publisher.WithLogger(c.log))
		if err != nil {
			return nil, err
		}
		c.pub = pub
	}
	return c.pub, nil
}

// redact hides every broker password and secret in s.
func (c *Console) redact(s string) string {
	for _, u := range c.cfg.URLs {
		s = strings.ReplaceAll(s, u, amqpurl.Redact(u))
	}
	for _, secret := range c.secrets {
		s = strings.ReplaceAll(s, secret, "xxxxx")
	}
	return outbox.Redact(s)
}

// state is the console's record of queue.
func (c *Console) state(queue string) *queueState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.queues[queue]
	if st == nil {
		st = &queueState{busy: make(chan struct{}, 1)}
		c.queues[queue] = st
	}
	return st
}

// lock waits until no look or action runs on queue, and takes the turn.
func (c *Console) lock(ctx context.Context, queue string) (unlock func(), err error) {
	st := c.state(queue)
	select {
	case st.busy <- struct{}{}:
		return func() { <-st.busy }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the look or action running on %s: %w", queue, ctx.Err())
	}
}

// Snapshot is what one look at a queue saw. A Snapshot is never changed:
// an action that removes messages makes a new one.
type Snapshot struct {
	Queue string
	Seq   int       // the look's number, counted per console
	Taken time.Time // when the look ended (messages handed back)
	// Depth is the queue's ready messages when the look began: the
	// snapshot holds the first min(Depth, limit) of them.
	Depth int
	Limit int
	// Messages are the dead letters seen and still on the queue as far as
	// the console knows (actions remove theirs), head first.
	Messages []*Message
	// Removed counts the messages the console's actions took off the queue
	// since the look.
	Removed int
	// MaxDeliveryCount is the highest x-delivery-count seen: a quorum
	// queue's count of deliveries, looks included.
	MaxDeliveryCount int
	// Version is the broker's.
	Version amqpconn.ServerVersion
	byKey   map[string][]*Message
}

// Seen is how many messages the look took.
func (s *Snapshot) Seen() int { return len(s.Messages) + s.Removed }

// Truncated reports whether the queue held more than the look took.
func (s *Snapshot) Truncated() bool { return s.Depth > s.Seen() }

// ByKey returns the messages of the snapshot with key k.
func (s *Snapshot) ByKey(k string) []*Message { return s.byKey[k] }

// without is s minus one message for each count of each key in done, of
// the messages in reports true of (nil: any).
func (s *Snapshot) without(done map[string]int, in func(*Message) bool) *Snapshot {
	left := make(map[string]int, len(done))
	for k, n := range done {
		left[k] = n
	}
	next := *s
	next.Messages = make([]*Message, 0, len(s.Messages))
	next.byKey = make(map[string][]*Message, len(s.byKey))
	for _, m := range s.Messages {
		if left[m.Key] > 0 && (in == nil || in(m)) {
			left[m.Key]--
			next.Removed++
			continue
		}
		next.Messages = append(next.Messages, m)
		next.byKey[m.Key] = append(next.byKey[m.Key], m)
	}
	return &next
}

// newSnapshot builds a Snapshot of deliveries taken from queue.
func newSnapshot(queue string, seq, depth, limit int, version amqpconn.ServerVersion, deliveries []amqp.Delivery, prefix string) *Snapshot {
	s := &Snapshot{Queue: queue, Seq: seq, Taken: time.Now(), Depth: depth, Limit: limit, Version: version,
		Messages: make([]*Message, len(deliveries)), byKey: make(map[string][]*Message, len(deliveries))}
	for i, d := range deliveries {
		m := newMessage(d, i, prefix)
		s.Messages[i] = m
		s.byKey[m.Key] = append(s.byKey[m.Key], m)
		s.MaxDeliveryCount = max(s.MaxDeliveryCount, amqphdr.DeliveryCount(d.Headers))
	}
	return s
}

// Snapshot returns the last look at queue, or takes one if there is none
// or if fresh. Looks wait for each other: a request that asked for a fresh
// look after another began takes that one's result.
func (c *Console) Snapshot(ctx context.Context, queue string, fresh bool) (*Snapshot, error) {
	asked := time.Now()
	unlock, err := c.lock(ctx, queue)
	if err != nil {
		return nil, err
	}
	defer unlock()
	st := c.state(queue)
	c.mu.Lock()
	snap := st.snap
	c.mu.Unlock()
	if snap != nil && (!fresh || snap.Taken.After(asked)) {
		return snap, nil
	}
	return c.look(ctx, queue)
}

// look takes a snapshot of queue; the caller holds its turn.
func (c *Console) look(ctx context.Context, queue string) (*Snapshot, error) {
	ch, version, err := c.channel(ctx)
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("queue %s: %w", queue, err)
	}
	deliveries, err := deadletter.Peek(ctx, ch, queue, c.limit, nil)
	// Every message goes back at once, before anything else is done with
	// them: the snapshot keeps copies.
	deadletter.HandBack(deliveries)
	if err != nil {
		return nil, err
	}
	// The next look or action on the queue, which waits for this one, must
	// find them back: the count a classic queue reports runs ahead of the
	// requeues.
	depth := max(q.Messages, len(deliveries))
	if _, err := deadletter.Settle(ctx, ch, queue, depth); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.seq++
	seq := c.seq
	c.mu.Unlock()
	snap := newSnapshot(queue, seq, depth, c.limit, version, deliveries, c.prefix)
	c.store(queue, snap)
	c.log.Info("console: looked at a queue", "queue", queue, "taken", len(deliveries), "depth", depth)
	return snap, nil
}

func (c *Console) store(queue string, snap *Snapshot) {
	st := c.state(queue)
	c.mu.Lock()
	st.snap = snap
	c.mu.Unlock()
}

// current is the last snapshot of queue, nil if none.
func (c *Console) current(queue string) *Snapshot {
	st := c.state(queue)
	c.mu.Lock()
	defer c.mu.Unlock()
	return st.snap
}

// Depth is the number of ready messages on queue now (a passive declare,
// which takes nothing).
func (c *Console) Depth(ctx context.Context, queue string) (int, error) {
	ch, _, err := c.channel(ctx)
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("queue %s: %w", queue, err)
	}
	return q.Messages, nil
}

// Queues is the queues the console shows: Config.Queues, then those
// Config.QueuesMatching matches, sorted, without repeats.
func (c *Console) Queues(ctx context.Context) ([]string, error) {
	queues := slices.Clone(c.cfg.Queues)
	var err error
	if c.lister != nil {
		var all []string
		if all, err = c.lister.list(ctx); err == nil {
			for _, q := range all {
				if c.cfg.QueuesMatching.MatchString(q) && !slices.Contains(queues, q) {
					queues = append(queues, q)
				}
			}
		}
	}
	return queues, err
}

// shown reports whether queue is one of the console's, or the archive of
// one: actions on any other are refused.
func (c *Console) shown(ctx context.Context, queue string) bool {
	if IsArchive(queue) && c.shown(ctx, strings.TrimSuffix(queue, ArchiveSuffix)) {
		return true
	}
	if slices.Contains(c.cfg.Queues, queue) {
		return true
	}
	if c.cfg.QueuesMatching == nil || !c.cfg.QueuesMatching.MatchString(queue) {
		return false
	}
	queues, _ := c.Queues(ctx)
	return slices.Contains(queues, queue)
}
