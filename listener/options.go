package listener

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"log/slog"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/internal/telemetry"
)

// Option configures New. An invalid value makes New fail with an error that
// names the option and the value.
type Option func(*config)

// MaxConsumers bounds WithMaxConcurrentConsumers, and the AMQP channels one
// listener opens (RabbitMQ's channel_max is 2047 per connection by
// default).
const MaxConsumers = 1000

// DefaultPrefetch is Spring AMQP's default prefetch, and was this
// package's default for every channel before the prefetch was sized from
// the concurrency (see WithPrefetch). With the default prefetch, a
// listener keeps room for at least this many deliveries per handler slot
// of WithMaxConcurrentConsumers waiting between retries: it opens another
// channel when its channels are full of them (a delivery waiting between
// retries keeps its prefetch slot until it is settled), so that a few
// poison messages in backoff never starve healthy ones.
const DefaultPrefetch = 250

// defaultPrefetch is a channel's prefetch without WithPrefetch: three
// deliveries per handler slot (NServiceBus sizes its prefetch so), at least
// 20, so that a slow handler's backlog is spread over the channels and
// processes that consume the queue rather than held by the first; in batch
// mode, room for a batch per slot and one being collected; with
// WithAckCoalescing, four times the acks that may wait, so that they keep
// flowing.
func defaultPrefetch(maxConcurrent int, batch *batchConfig, coalesceAcks int) int {
	n := max(3*maxConcurrent, 20, 4*coalesceAcks)
	if batch != nil {
		n = max(n, (maxConcurrent+1)*batch.size)
	}
	return min(n, 65535)
}

type config struct {
	conn            amqpconn.Config
	urlOption       string // the option that set conn.URLs, for errors
	logger          *slog.Logger
	min, max        int
	maxSet          bool
	prefetch        int
	prefetchSet     bool // WithPrefetch was given
	declare         func(*amqp.Channel) error
	shutdownTimeout time.Duration
	consumerTimeout time.Duration
	requeueDelay    time.Duration
	requeueDelayMax time.Duration
	deadLetterBurst int           // WithDeadLetterLog
	deadLetterEvery time.Duration // ...
	requeueDelaySet bool          // WithRequeueDelay was given: New refuses a max that outlives the consumer timeout, where it caps the default's
	scaleInterval   time.Duration
	idleTimeout     time.Duration
	drainTarget     time.Duration
	missingFatal    bool
	failFast        bool
	urlSet          bool // WithURL or WithURLs was given
	redeliveryLimit int  // 0: off
	// consumerTimeoutArg is sent as x-consumer-timeout on basic.consume; 0: not sent
	consumerTimeoutArg time.Duration
	killSwitch         *KillSwitch // nil: off
	consumer           consumerOptions
	consumeArgs        amqp.Table // basic.consume's, built by New from consumer and consumerTimeoutArg; nil for none
	telemetry          telemetry.Config
	producerParent     bool
	// ackCoalescing: acks that may wait (0: off) and how long the first may.
	coalesceAcks  int
	coalesceDelay time.Duration
	errs          []error
}

func defaultConfig() config {
	return config{
		conn: amqpconn.Config{
			URLs:        []string{"amqp://guest:guest@127.0.0.1:5672/"},
			Heartbeat:   10 * time.Second,
			DialTimeout: 10 * time.Second,
			Name:        "amqpretry listener",
		},
		min:             1,
		shutdownTimeout: 10 * time.Second,
		consumerTimeout: 30 * time.Minute,
		requeueDelay:    time.Second,
		deadLetterBurst: 10,
		deadLetterEvery: 10 * time.Second,
		requeueDelayMax: 30 * time.Second,
		scaleInterval:   250 * time.Millisecond,
		idleTimeout:     10 * time.Second,
		drainTarget:     2 * time.Second,
	}
}

func (c *config) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("listener: "+format, args...))
}

// checkConnection records what is wrong with the connection options: a URL
// that does not parse, a TLS config beside an amqp:// URL.
func (c *config) checkConnection() {
	for _, url := range c.conn.URLs {
		if _, err := amqpurl.Parse(url); err != nil {
			c.fail("%s: %v", cmp.Or(c.urlOption, "WithURL"), err)
		}
	}
	for _, url := range c.conn.PlaintextDespiteTLS() {
		c.fail("WithTLS: %s is amqp://, which never uses TLS: use amqps:// (port 5671 by default) or drop WithTLS", url)
	}
}

// WithURL sets the broker, amqp:// or amqps://. Default
// amqp://guest:guest@127.0.0.1:5672/, a local broker's: Run logs a warning
// when it uses it.
func WithURL(url string) Option {
	return func(c *config) { c.conn.URLs, c.urlOption, c.urlSet = []string{url}, "WithURL", true }
}

// WithURLs sets the nodes of a cluster, amqp:// or amqps:// each (Spring
// AMQP's addresses). Each dial tries them in a random order, so that the
// listeners of a fleet spread over the nodes, and logs the node it reached;
// after losing a connection the listener dials the other nodes at once,
// the lost one last. WithURLsInOrder keeps the order given. A node that
// refuses the login ends Run, as with one URL: the nodes of a cluster share
// their users.
func WithURLs(urls ...string) Option {
	return func(c *config) {
		if len(urls) == 0 {
			c.fail("WithURLs expects at least one URL")
		}
		c.conn.URLs = nil
		for _, u := range urls {
			if !slices.Contains(c.conn.URLs, u) {
				c.conn.URLs = append(c.conn.URLs, u)
			}
		}
		c.urlOption, c.urlSet = "WithURLs", true
	}
}

// WithURLsInOrder makes each dial try the URLs in the order given, the
// first one preferred, instead of a random order (Spring AMQP's
// AddressShuffleMode.NONE rather than RANDOM).
func WithURLsInOrder() Option { return func(c *config) { c.conn.InOrder = true } }

// WithTLS sets the TLS configuration for amqps://. Without it, amqps://
// verifies the broker against the system's roots and the URL's host name.
// The config is cloned at each dial, so one may be shared. New refuses it
// with an amqp:// URL, which never uses TLS: a silent fall back to plaintext.
func WithTLS(t *tls.Config) Option { return func(c *config) { c.conn.TLS = t } }

// WithHeartbeat sets the AMQP heartbeat: a broker that stops answering is
// noticed within about two intervals, and the listener redials. Default 10s.
func WithHeartbeat(d time.Duration) Option {
	return func(c *config) {
		if d < time.Second {
			c.fail("WithHeartbeat expects at least 1s, got %v", d)
		}
		c.conn.Heartbeat = d
	}
}

// WithDialTimeout bounds each dial: the TCP connect and the TLS and AMQP
// handshakes of one address. A broker that accepts the connection and then
// says nothing (a frozen node) costs that long per try, and WithFailFast
// fails after it. While a dial is pending for more than a second,
// Stats().LastConnectionError says so. Default 10s.
func WithDialTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < 100*time.Millisecond {
			c.fail("WithDialTimeout expects at least 100ms, got %v", d)
		}
		c.conn.DialTimeout = d
	}
}

// WithDeadLetterLog sets how dead letters are logged: the first burst of a
// flood one by one, in full (queue, message id, destination, attempts,
// error type and text), then one summary line per interval with how many
// more and their error types. After an interval with none beyond the burst,
// the next ones are logged in full again. Stats().DeadLettered, the
// amqpretry.dead_lettered metric and OnRecover hooks count every one
// whatever is logged. The warning for a message that failed and went back
// to the broker (rejected, as Recover(recoverer.Reject()) has it for the
// queue's own dead-letter exchange, or requeued) is limited the same way,
// on a budget of its own, its summaries counting by settlement and error
// type; Stats().Failed counts each. burst 0 logs summaries only. Default
// 10, 10s.
func WithDeadLetterLog(burst int, interval time.Duration) Option {
	return func(c *config) {
		if burst < 0 || interval < 100*time.Millisecond {
			c.fail("WithDeadLetterLog expects a burst of 0 or more and an interval of at least 100ms, got %d, %v", burst, interval)
		}
		c.deadLetterBurst, c.deadLetterEvery = burst, interval
	}
}

// WithConnectionName sets the name the broker shows for the connection.
func WithConnectionName(name string) Option { return func(c *config) { c.conn.Name = name } }

// WithLogger sets where connection problems and scaling decisions (debug) go.
// Default slog.Default(); URLs are logged with the password hidden.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.fail("WithLogger expects a non-nil logger")
		}
		c.logger = l
	}
}

// WithConcurrentConsumers sets how many handlers run at once, at least
// (Spring's concurrentConsumers, MassTransit's ConcurrentMessageLimit
// without scaling). Default 1. They share the listener's channels (as
// many as this, at least two when it may scale): a channel is not a
// handler, and a slow handler's backlog runs on every slot.
func WithConcurrentConsumers(n int) Option {
	return func(c *config) {
		if n < 1 || n > MaxConsumers {
			c.fail("WithConcurrentConsumers expects 1 to %d, got %d", MaxConsumers, n)
		}
		c.min = n
	}
}

// WithMaxConcurrentConsumers sets how many handlers may run at once under
// load (Spring's maxConcurrentConsumers). The listener grows toward it as
// soon as a delivery waits for a handler while every one is busy, or
// messages wait at the broker, and shrinks back once no delivery has waited
// for the idle timeout (WithIdleTimeout). Default: the concurrent
// consumers, which turns scaling off.
func WithMaxConcurrentConsumers(n int) Option {
	return func(c *config) { c.max, c.maxSet = n, true }
}

// WithPrefetch sets each channel's basic.qos prefetch count, 1 to 65535.
// Default: three per handler of WithMaxConcurrentConsumers, at least 20
// (in batch mode, room for a batch per handler and one more), so that a
// backlog of slow messages spreads over the processes that consume the
// queue; the listener opens more channels when deliveries waiting between
// retries fill them (see DefaultPrefetch). A prefetch of 1 with one handler
// asks for the queue's order, which the listener then keeps: one channel,
// one handler, and nothing handled past a message waiting between
// retries. AMQP's 0, no limit, is
// refused: every delivery waiting between retries or before its requeue
// holds a goroutine, and without a limit the broker would send the whole
// queue to a consumer whose messages fail.
func WithPrefetch(n int) Option {
	return func(c *config) {
		switch {
		case n == 0:
			c.fail("WithPrefetch expects 1 to 65535, got 0 (no limit): each delivery waiting between retries holds a goroutine, so the prefetch is what bounds them")
		case n < 0 || n > 65535:
			c.fail("WithPrefetch expects 1 to 65535, got %d", n)
		}
		c.prefetch, c.prefetchSet = n, true
	}
}

// WithDeclare runs declare on every (re)connection, before consuming: declare
// the queue and whatever it needs there (dlx.Topology's Declare fits, and
// learns the broker's version from the channel). A declaration the broker
// refuses (403, 405, 406, 530: a queue that exists with other arguments) or
// that declare itself rejects (an invalid dlx.Topology, a layout the broker's
// version cannot hold) ends Run with the error. A lost connection, or a 404
// (a binding to an exchange another service may declare yet), is retried
// with a backoff that grows until a connection gets as far as consuming; in
// a Group, on the group's connection, with a backoff of the listener's own.
func WithDeclare(declare func(ch *amqp.Channel) error) Option {
	return func(c *config) {
		if declare == nil {
			c.fail("WithDeclare expects a non-nil function")
		}
		c.declare = declare
	}
}

// WithShutdownTimeout bounds how long Run lets running handlers finish once
// its context is done; then it cancels their context. Deliveries waiting
// between retries are requeued at once. Default 10s.
func WithShutdownTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.fail("WithShutdownTimeout expects a duration >= 0, got %v", d)
		}
		c.shutdownTimeout = d
	}
}

// WithConsumerTimeout tells New the broker's consumer_timeout (30 minutes by
// default): New refuses a chain whose retries could keep a delivery unacked
// longer, since the broker would close the channel under it. At run time
// the listener warns at 80% of it: when the oldest delivery in flight has
// been held that long, and when a consumer's prefetch times its mean handler
// time says the last of a full prefetch would wait that long. Default 30m.
func WithConsumerTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail("WithConsumerTimeout expects a duration > 0, got %v", d)
		}
		c.consumerTimeout = d
	}
}

// WithConsumerTimeoutArgument asks the broker for a consumer timeout of d
// on each of the listener's consumers, with the x-consumer-timeout argument
// of basic.consume, and tells New so (as WithConsumerTimeout). What brokers
// do with it differs (tested): RabbitMQ 4.3 honours it on quorum queues,
// where a delivery held past d makes the broker cancel the consumer and take
// its unacked deliveries back, uncounted (the listener logs it, cancels
// those handlers and starts a new consumer), and refuses it on classic
// queues, which 4.3 no longer times out: Run then ends with a
// *ConsumeRefusedError naming this option. RabbitMQ 3.10.8 and 4.0.5 accept
// it and ignore it: on 4.0 the x-consumer-timeout queue argument
// (dlx.Topology's QueueArguments) or a consumer-timeout policy works
// instead, and 3.10 has only the global consumer_timeout. d is whole
// milliseconds, at least 1s.
func WithConsumerTimeoutArgument(d time.Duration) Option {
	return func(c *config) {
		if d < time.Second || d%time.Millisecond != 0 {
			c.fail("WithConsumerTimeoutArgument expects whole milliseconds, at least 1s, got %v", d)
		}
		c.consumerTimeoutArg, c.consumerTimeout = d, d
	}
}

// WithRequeueDelay sets how long a redelivered message that fails again waits
// before it is requeued, so that a poison message without a recoverer comes
// back once a second instead of a thousand times. The delay doubles with the
// broker's x-delivery-count (quorum queues) up to max. Default 1s, 30s;
// initial 0 turns the delay off. The delivery stays unsettled while it
// waits, so the wait counts toward the consumer timeout with the chain's:
// New refuses a max that, added to the chain's waits, reaches the consumer
// timeout (WithConsumerTimeout), and caps the default's to fit; each wait is
// also cut to the time the delivery has left before the timeout.
func WithRequeueDelay(initial, max time.Duration) Option {
	return func(c *config) {
		if initial < 0 || max < initial {
			c.fail("WithRequeueDelay expects 0 <= initial <= max, got %v, %v", initial, max)
		}
		c.requeueDelay, c.requeueDelayMax, c.requeueDelaySet = initial, max, true
	}
}

// WithMissingQueueFatal makes a missing queue end Run with ErrQueueNotFound
// instead of being retried with backoff.
func WithMissingQueueFatal() Option { return func(c *config) { c.missingFatal = true } }

// WithFailFast makes Run end with the error when its first connection
// cannot be made (the broker is down or unreachable), as publisher.New
// does, instead of redialling until it comes: for a service that should
// fail its start-up, and be restarted, rather than wait. Once connected,
// losses are redialled as always. A refused login or TLS certificate ends
// Run with or without it.
func WithFailFast() Option { return func(c *config) { c.failFast = true } }
