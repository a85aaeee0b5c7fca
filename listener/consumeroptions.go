package listener

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// consumerOptions are what each basic.consume of the listener carries
// besides the queue: the consumer arguments, the exclusive flag, the tag.
type consumerOptions struct {
	priority    int32
	prioritySet bool
	exclusive   bool
	tagPrefix   string // "": DefaultConsumerTagPrefix
}

// DefaultConsumerTagPrefix starts the tags of the listener's consumers
// without WithConsumerTagPrefix.
const DefaultConsumerTagPrefix = "amqpretry"

// maxTagPrefix leaves room in the 255-byte consumer tag for the sequence
// number and the process's random part.
const maxTagPrefix = 200

// WithConsumerPriority gives each of the listener's consumers the priority
// p, the x-priority argument of basic.consume (Spring AMQP's x-priority
// consumer argument, MassTransit's ConsumerPriority): the broker sends a
// queue's messages to its highest-priority consumers that have room in their
// prefetch, and to lower ones only while those are full. The default is 0;
// negative priorities are below it. Priorities order the consumers of one
// queue, a service's hot spare at -1, say, or a local replica at 10 ahead of
// a remote one; they do not order messages (see dlx.Topology.MaxPriority).
// Classic and quorum queues honour them on RabbitMQ 3.10, 4.0 and 4.3
// (tested). On a single-active-consumer queue
// (dlx.Topology.SingleActiveConsumer) they also choose the active consumer
// on quorum queues from RabbitMQ 4.0: a higher-priority consumer that joins
// takes over; classic queues, and quorum queues on 3.10, keep the one that
// came first (tested). p is a 32-bit signed integer.
func WithConsumerPriority(p int) Option {
	return func(c *config) {
		if p < math.MinInt32 || p > math.MaxInt32 {
			c.fail("WithConsumerPriority expects a 32-bit signed integer (%d to %d), got %d", math.MinInt32, math.MaxInt32, p)
		}
		c.consumer.priority, c.consumer.prioritySet = int32(p), true
	}
}

// WithExclusive makes the listener's consumer exclusive (basic.consume with
// exclusive set; Spring AMQP's exclusive, MassTransit's ExclusiveConsumer):
// while it consumes, the broker refuses every other consumer of the queue
// with 403 ACCESS_REFUSED, and it is itself refused if the queue has a
// consumer already. An exclusive consumer is one consumer: New refuses it
// with more than one (WithConcurrentConsumers, WithMaxConcurrentConsumers).
//
// A listener refused in either way ends Run with a *ConsumeRefusedError
// (ErrConsumeRefused) that says which, at the start and at any later
// consume: it does not retry for ever, as Spring's container does every
// recoveryInterval. The exception is the listener's own consumer: right
// after a lost connection the broker may not have noticed the loss yet and
// still hold the old consumer, and as the listener hands over from the
// consumer it starts with under WithRedeliveryLimit, or a kill switch's
// probe, the old consumer may not be gone yet. Such refusals are retried
// with backoff for ExclusiveRefusalGrace after a lost connection, and while
// the listener has a consumer of its own still stopping.
//
// Exclusive consumption is a classic queue's: quorum queues accept the flag
// and ignore it on RabbitMQ 3.10, 4.0 and 4.3 (tested), so a second consumer
// gets messages too. For one consumer at a time with standbys that take over
// when it goes, on either queue type, use a single-active-consumer queue
// instead (dlx.Topology.SingleActiveConsumer).
func WithExclusive() Option { return func(c *config) { c.consumer.exclusive = true } }

// WithConsumerTagPrefix starts the tags of the listener's consumers with
// prefix, so that rabbitmqctl list_consumers and the management UI show
// which service a consumer belongs to (Spring AMQP's consumerTagStrategy).
// A tag is prefix-n-r: n counts the consumers the process has started, r is
// random and the same for every consumer of the process, which tells two
// processes apart where every process id is 1 (containers). Default
// DefaultConsumerTagPrefix. The prefix is UTF-8 without control characters,
// 1 to 200 bytes.
func WithConsumerTagPrefix(prefix string) Option {
	return func(c *config) {
		switch {
		case prefix == "":
			c.fail("WithConsumerTagPrefix expects a prefix, got \"\"")
		case len(prefix) > maxTagPrefix:
			c.fail("WithConsumerTagPrefix expects at most %d bytes (a consumer tag has 255), got %d: %.40q…", maxTagPrefix, len(prefix), prefix)
		case !utf8.ValidString(prefix) || strings.IndexFunc(prefix, unicode.IsControl) >= 0:
			c.fail("WithConsumerTagPrefix expects UTF-8 without control characters, got %q", prefix)
		}
		c.consumer.tagPrefix = prefix
	}
}

// checkConsumer records what is wrong with the consumer options together
// with the consumer counts.
func (c *config) checkConsumer() {
	if !c.consumer.exclusive || c.max <= 1 {
		return
	}
	counts := fmt.Sprintf("WithMaxConcurrentConsumers(%d)", c.max)
	if !c.maxSet {
		counts = fmt.Sprintf("WithConcurrentConsumers(%d)", c.min)
	} else if c.min > 1 {
		counts = fmt.Sprintf("WithConcurrentConsumers(%d) and WithMaxConcurrentConsumers(%d)", c.min, c.max)
	}
	c.fail("WithExclusive allows one consumer on the queue, but %s asks for up to %d: the broker would refuse the listener's own second consumer. "+
		"Use one consumer with WithExclusive, or drop WithExclusive (for consumers of which one receives at a time and the others stand by, "+
		"use a single-active-consumer queue: dlx.Topology.SingleActiveConsumer)", counts, c.max)
}

// arguments is the basic.consume arguments table, nil for none. New builds
// it once; consumers only read it.
func (o consumerOptions) arguments(timeoutArg int64) amqp.Table {
	var args amqp.Table
	if o.prioritySet {
		args = amqp.Table{"x-priority": o.priority}
	}
	if timeoutArg > 0 {
		if args == nil {
			args = amqp.Table{}
		}
		args["x-consumer-timeout"] = timeoutArg
	}
	return args
}

// processTag is the random part of every consumer tag of this process.
var processTag = func() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

var consumerSeq atomic.Uint64

// nextTag is the tag of the listener's next consumer.
func (o consumerOptions) nextTag() string {
	prefix := o.tagPrefix
	if prefix == "" {
		prefix = DefaultConsumerTagPrefix
	}
	return fmt.Sprintf("%s-%d-%s", prefix, consumerSeq.Add(1), processTag)
}

// ExclusiveRefusalGrace is how long after losing a connection a listener
// with WithExclusive retries a refusal of its exclusive consumer, which may
// be the broker still holding the consumer of the lost connection: a broker
// notices a lost client within two heartbeats (WithHeartbeat, 10s by
// default), a cluster a lost node within net_ticktime (60s by default).
const ExclusiveRefusalGrace = 90 * time.Second

// exclusiveMayBeOurs reports whether a 403 refusal of basic.consume may be
// the listener's own exclusive consumer still in the broker's books (see
// WithExclusive), and so is retried; fatal is false then, and why says
// which case it is.
func (s *session) exclusiveMayBeOurs(aerr *amqp.Error, now time.Time) (ours bool, why string) {
	l := s.sv.l
	if !l.cfg.consumer.exclusive || aerr.Code != amqp.AccessRefused || !strings.Contains(aerr.Reason, "exclusive") {
		return false, ""
	}
	if l.ownConsumerStopping() {
		return true, "a consumer of this listener is still stopping"
	}
	if lost := s.sv.lostAt; !lost.IsZero() && now.Sub(lost) < ExclusiveRefusalGrace {
		return true, "the broker may not have noticed the lost connection yet"
	}
	return false, ""
}

// ownConsumerStopping reports whether a consumer of the listener has been
// cancelled and has not finished yet.
func (l *Listener) ownConsumerStopping() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.consumers {
		if c.stopping.Load() {
			return true
		}
	}
	return false
}
