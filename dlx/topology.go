package dlx

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
)

// QueueType is the RabbitMQ queue type every queue of a Topology gets.
type QueueType string

const (
	Classic QueueType = "classic"
	Quorum  QueueType = "quorum"
)

// Topology is the dead-letter and retry layout of one work queue. The zero
// values of its optional fields are documented defaults; Declare creates it
// all, idempotently, and is what listener.WithDeclare expects:
//
//	topo := dlx.Topology{Queue: "orders", RetryDelays: []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute}}
//	l, err := listener.New("orders", chain, handle, listener.WithDeclare(topo.Declare))
//
// Declared, for a work queue Q:
//
//	Q             dead-letters to the DLX (so a rejected message lands on the DLQ)
//	Q.dlx         direct exchange, Q.dlq bound to it with routing key Q
//	Q.dlq         the dead-letter queue
//	Q.retry.10s   one per RetryDelays entry: x-message-ttl = the delay, dead-letters
//	Q.retry.1m    through the default exchange with routing key Q, so the message
//	...           returns to Q and to no other queue bound to Q's routing key
//
// With SingleRetryDelay instead of RetryDelays, the common single-delay
// layout built from RabbitMQ's dead-lettering and queue TTL
// (https://www.rabbitmq.com/docs/dlx, https://www.rabbitmq.com/docs/ttl):
// Q dead-letters into one Q.retry queue whose TTL sends messages
// back, and a rejection is a retry, atomically in the broker (see
// RejectToRetry). There a rejection never reaches the DLQ: a Permanent error
// with no recoverer, or recoverer.Reject(), sends the message round Q.retry
// forever. Every chain consuming Q must end in
//
//	middleware.Recover(topo.RejectToRetry(n, recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())))
type Topology struct {
	// Queue is the work queue. Required.
	Queue string
	// Type is the type of every queue declared: Classic (the default) or
	// Quorum. Retry and dead-letter queues take this type too: set Quorum for a
	// quorum work queue, even one declared elsewhere (SkipWorkQueue).
	Type QueueType
	// QueueArguments are added to the work queue's arguments (x-max-length,
	// ...). Validate refuses the ones Declare sets itself, which would be
	// lost: x-dead-letter-exchange and x-dead-letter-routing-key, x-queue-type
	// (which the retry queues and DLQ would not get: see Type), and on a
	// quorum queue x-delivery-limit with DeliveryLimit, x-overflow and
	// x-dead-letter-strategy with AtLeastOnce. Not with SkipWorkQueue. With
	// retry queues (RetryDelays, SingleRetryDelay) it refuses a classic work
	// queue's length limit with x-overflow reject-publish too: a retry that
	// comes back while the queue is full is refused, and RabbitMQ drops it.
	QueueArguments amqp.Table
	// SkipWorkQueue leaves the work queue to someone else: only the exchange,
	// dead-letter and retry queues are declared, and the work queue's own
	// dead-lettering (a policy, say) is yours to set. The work queue must
	// exist before a retry leaves a tier: the broker drops a message
	// dead-lettered to a queue that is not there.
	SkipWorkQueue bool

	// Exchange, when set, is declared (ExchangeKind, default "direct") and the
	// work queue bound to it with BindingKeys (default: the queue's name).
	// ExchangeKind and BindingKeys need Exchange, and BindingKeys a work
	// queue of ours (not SkipWorkQueue): Validate refuses them otherwise.
	Exchange     string
	ExchangeKind string
	BindingKeys  []string

	// DeadLetterExchange defaults to Queue+".dlx", DeadLetterQueue to
	// Queue+".dlq", DeadLetterRoutingKey (binding the DLQ to the DLX) to Queue.
	DeadLetterExchange   string
	DeadLetterQueue      string
	DeadLetterRoutingKey string

	// RetryDelays are the broker-side retry tiers, shortest first.
	RetryDelays []time.Duration
	// RetryQueueName names the tier for a delay; default Queue+".retry."+delay
	// ("orders.retry.10s", "orders.retry.1m"). Not with SingleRetryDelay,
	// whose one retry queue is always Queue+".retry".
	RetryQueueName func(delay time.Duration) string
	// SingleRetryDelay selects the single-delay layout with one retry queue,
	// Queue+".retry", instead of RetryDelays. The work queue then
	// dead-letters every rejection into the retry queue, which returns it
	// after the delay: only a recoverer that publishes takes a message to the
	// DLQ, so every chain must end in Recover(topo.RejectToRetry(n,
	// recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey()))).
	// Anything else the work queue dead-letters goes round the same loop
	// without a rejection, which RabbitMQ drops silently: Validate refuses
	// DeliveryLimit, and QueueArguments with x-message-ttl or a length
	// limit that drops messages, with it. A quorum work queue on RabbitMQ 4
	// has a delivery limit of 20 all the same (returns after crashes and
	// lost connections count): keep listener.WithRedeliveryLimit below it, so
	// that the listener, not the broker, takes such a message out of the loop.
	SingleRetryDelay time.Duration

	// DeliveryLimit sets x-delivery-limit on the quorum work and retry queues
	// (0: the broker's default, none on RabbitMQ 3 and 20 on 4; a
	// delivery-limit policy can set it too). Past it the broker dead-letters
	// the message to the DLQ (reason delivery_limit). The DLQ never gets it:
	// inspecting or filtering a DLQ (amqpretry dlq list, Replay with a match)
	// hands messages back, which RabbitMQ 4.0 counts as a delivery, and a DLQ
	// has nowhere to send the ones past the limit. A quorum DLQ gets
	// x-delivery-limit int64(math.MaxInt32) instead (see DLQArguments), so
	// that RabbitMQ 4's default of 20 never drops a dead letter.
	DeliveryLimit int
	// DLQArguments are added to the dead-letter queue's arguments. A DLQ
	// has no dead-letter exchange of its own, so what it drops is gone:
	// x-message-ttl, x-expires and a length limit without
	// x-overflow=reject-publish throw dead letters away without a word
	// (tested on 3.10, 4.0 and 4.3). Use them only for dead letters you
	// mean to lose after a while. A quorum
	// DLQ gets x-delivery-limit int64(math.MaxInt32), unlimited in practice on
	// RabbitMQ 3.10 and 4.x alike, unless DLQArguments names another (not -1,
	// which is unlimited on 4 but drops a message at its first return on
	// 3.10) or DLQWithBrokerDefaultLimit is set. Not x-queue-type: see Type.
	DLQArguments amqp.Table
	// DLQWithBrokerDefaultLimit declares a quorum DLQ without
	// x-delivery-limit, as versions before the default above did, so that a
	// DLQ created by them still declares (queue arguments cannot change: the
	// broker refuses the declaration with a *ConflictError). It leaves the DLQ
	// the broker's default: none on RabbitMQ 3.x, which is safe; 20 on 4.x,
	// where every look at a dead letter counts and the broker drops it after
	// 20, unless a policy sets the DLQ's delivery-limit (the ConflictError
	// gives the command). Set it only for such a DLQ. Needs Type Quorum.
	DLQWithBrokerDefaultLimit bool
	// AtLeastOnce makes quorum queues dead-letter at least once
	// (x-dead-letter-strategy=at-least-once, which needs x-overflow=reject-publish)
	// instead of at most once.
	AtLeastOnce bool

	// DelayedRedelivery has the quorum work queue retry failed deliveries
	// itself, after a delay, and dead-letter them at least once past the
	// limit: RabbitMQ 4.3's delayed retry, with no retry queues. Recover
	// with Redeliver. See DelayedRedelivery for the schedule, and for older
	// brokers.
	DelayedRedelivery *DelayedRedelivery

	// MaxPriority gives a classic work queue priorities 0 to MaxPriority
	// (x-max-priority, at most 255; RabbitMQ advises at most 10): a message
	// with a higher priority is delivered first. Quorum queues need no
	// argument and refuse this one (RabbitMQ 4.3.6 included): from RabbitMQ
	// 4.0 they deliver priorities above 4 ahead of the rest, and RabbitMQ 4.3
	// orders them strictly by priority; 3.x quorum queues ignore priorities.
	// Republish and Tiers keep a message's priority.
	MaxPriority int

	// SingleActiveConsumer gives the work queue single active consumer
	// (x-single-active-consumer; MassTransit's SingleActiveConsumer): of
	// the queue's consumers, the broker delivers to one at a time, the
	// first registered (on quorum queues from RabbitMQ 4.0, the one with
	// the highest listener.WithConsumerPriority), and when it goes (its
	// process dies, its connection or channel closes, it is cancelled) to
	// the next, starting with the messages the one that went had not
	// acked. Run a listener with one consumer (the default) in each of
	// several processes: one works, the others stand by and take over.
	// Classic and quorum queues alike, on RabbitMQ 3.10, 4.0 and 4.3
	// (tested); a policy cannot set it (the broker refuses the key), and an
	// existing queue cannot gain or lose it (Declare returns a
	// *ConflictError).
	//
	// Only the work queue gets it. The retry queues have no consumers
	// (their TTL sends messages back to the work queue), and the DLQ is
	// read with basic.get (Replay, amqpretry dlq), which it would not
	// limit anyway.
	//
	// It makes one consumer at a time, not an order across failures. Retry
	// tiers and DelayedRedelivery send a failed message behind the ones
	// published since, and a delivery waiting between local retries lets
	// the others in the prefetch pass it (see listener's Consumers). For
	// messages handled in queue order, with failover: WithPrefetch(1),
	// local retries only (middleware.Retry), and a recoverer that takes a
	// message that exhausts them out of the way (to the DLQ).
	//
	// A listener stopping on such a queue (shutdown, scale-down) finishes
	// the handler that runs and then closes its channel, rather than
	// cancelling first: the standby starts after that handler ended, with
	// the messages the stopping one had prefetched, in order.
	//
	// A listener that declares the queue (listener.WithDeclare(t.Declare))
	// knows it is single-active: with more than one consumer it warns once
	// that they add no throughput, and it does not scale up. On a queue
	// declared elsewhere it finds out by watching: a consumer of its own
	// that gets nothing while messages are ready. Not with SkipWorkQueue.
	SingleActiveConsumer bool
}

// DLX is the dead-letter exchange's name.
func (t Topology) DLX() string { return cmp.Or(t.DeadLetterExchange, t.Queue+".dlx") }

// DLQ is the dead-letter queue's name.
func (t Topology) DLQ() string { return cmp.Or(t.DeadLetterQueue, t.Queue+".dlq") }

// DLQRoutingKey is the routing key that takes a message from the DLX to the DLQ.
func (t Topology) DLQRoutingKey() string { return cmp.Or(t.DeadLetterRoutingKey, t.Queue) }

// RetryQueue is the name of the tier for delay.
func (t Topology) RetryQueue(delay time.Duration) string {
	if t.RetryQueueName != nil {
		return t.RetryQueueName(delay)
	}
	return t.Queue + ".retry." + FormatDelay(delay)
}

// SingleRetryQueue is the retry queue of the single-delay layout.
func (t Topology) SingleRetryQueue() string { return t.Queue + ".retry" }

// FormatDelay writes a delay the way retry queues are named: 500ms, 10s,
// 1m, 2h.
func FormatDelay(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return fmt.Sprintf("%dms", d/time.Millisecond)
}

// Validate reports every problem with the topology's fields, each naming the
// field and its value.
func (t Topology) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if t.Queue == "" {
		bad("dlx: Topology.Queue is required")
	}
	if t.Type != "" && t.Type != Classic && t.Type != Quorum {
		bad("dlx: Topology.Type must be %q or %q, got %q", Classic, Quorum, t.Type)
	}
	if len(t.RetryDelays) > 0 && t.SingleRetryDelay > 0 {
		bad("dlx: set Topology.RetryDelays or Topology.SingleRetryDelay, not both")
	}
	if t.SingleRetryDelay < 0 || (t.SingleRetryDelay > 0 && t.SingleRetryDelay < time.Millisecond) {
		bad("dlx: Topology.SingleRetryDelay must be at least 1ms, got %v", t.SingleRetryDelay)
	}
	if t.DeliveryLimit < 0 {
		bad("dlx: Topology.DeliveryLimit must be >= 0, got %d", t.DeliveryLimit)
	}
	if (t.DeliveryLimit > 0 || t.AtLeastOnce) && t.Type != Quorum {
		bad("dlx: Topology.DeliveryLimit and Topology.AtLeastOnce need Type: dlx.Quorum")
	}
	if t.DelayedRedelivery != nil {
		errs = append(errs, t.DelayedRedelivery.validate(t)...)
	}
	if t.MaxPriority < 0 || t.MaxPriority > 255 {
		bad("dlx: Topology.MaxPriority expects 0 to 255, got %d", t.MaxPriority)
	}
	if t.MaxPriority > 0 && t.Type == Quorum {
		bad("dlx: Topology.MaxPriority %d is x-max-priority, which RabbitMQ refuses on quorum queues: they deliver by message priority without it "+
			"(from RabbitMQ 4.0; strictly from 4.3): drop MaxPriority", t.MaxPriority)
	}
	if t.MaxPriority > 0 && t.SkipWorkQueue {
		bad("dlx: Topology.MaxPriority %d is not used with Topology.SkipWorkQueue: the work queue is declared elsewhere", t.MaxPriority)
	}
	if t.SingleActiveConsumer && t.SkipWorkQueue {
		bad("dlx: Topology.SingleActiveConsumer is not used with Topology.SkipWorkQueue: the work queue is declared elsewhere, with x-single-active-consumer there if it is to have it")
	}
	if t.DLQWithBrokerDefaultLimit && t.Type != Quorum {
		bad("dlx: Topology.DLQWithBrokerDefaultLimit is for a quorum DLQ created without x-delivery-limit: it needs Type: dlx.Quorum, got %q", cmp.Or(t.Type, Classic))
	}
	if v, ok := t.DLQArguments["x-delivery-limit"]; ok && t.DLQWithBrokerDefaultLimit {
		bad("dlx: Topology.DLQWithBrokerDefaultLimit declares the DLQ without x-delivery-limit, but Topology.DLQArguments sets it to %v: drop one", v)
	}
	if t.Exchange == "" && t.ExchangeKind != "" {
		bad("dlx: Topology.ExchangeKind %q needs Topology.Exchange: without it no exchange is declared", t.ExchangeKind)
	}
	if t.Exchange == "" && len(t.BindingKeys) > 0 {
		bad("dlx: Topology.BindingKeys %q need Topology.Exchange: without it the work queue is bound to nothing", t.BindingKeys)
	}
	if t.SkipWorkQueue && len(t.QueueArguments) > 0 {
		bad("dlx: Topology.QueueArguments %v are not used with Topology.SkipWorkQueue: the work queue is declared elsewhere", t.QueueArguments)
	}
	if t.SkipWorkQueue && t.Exchange != "" && len(t.BindingKeys) > 0 {
		bad("dlx: Topology.BindingKeys %q are not used with Topology.SkipWorkQueue: the work queue is not bound either", t.BindingKeys)
	}
	if t.SingleRetryDelay > 0 {
		errs = append(errs, t.singleDelayCycles()...)
	}
	if err := t.retryRefusedWhenFull(); err != nil {
		errs = append(errs, err)
	}
	if t.RetryQueueName != nil && t.SingleRetryDelay > 0 {
		bad("dlx: Topology.RetryQueueName is not used with Topology.SingleRetryDelay %v: that layout's retry queue is always Queue+\".retry\" (%q)",
			t.SingleRetryDelay, t.SingleRetryQueue())
	}
	if !t.SkipWorkQueue {
		owned := t.workQueueArguments()
		for _, k := range slices.Sorted(maps.Keys(t.QueueArguments)) {
			if o, ok := owned[k]; ok && !sameArgument(t.QueueArguments[k], o.value) {
				bad("dlx: Topology.QueueArguments[%q] = %s: %s", k, quoted(t.QueueArguments[k]), o.why)
			}
		}
	}
	if v, ok := t.DLQArguments["x-queue-type"]; ok && !sameArgument(v, string(cmp.Or(t.Type, Classic))) {
		bad("dlx: Topology.DLQArguments[\"x-queue-type\"] = %s: the other queues of the topology would not get it; set Topology.Type", quoted(v))
	}
	seen := map[string]bool{}
	for i, d := range t.RetryDelays {
		if d < time.Millisecond {
			bad("dlx: Topology.RetryDelays[%d] must be at least 1ms, got %v", i, d)
		}
		if i > 0 && d < t.RetryDelays[i-1] {
			bad("dlx: Topology.RetryDelays must be in increasing order, got %v after %v", d, t.RetryDelays[i-1])
		}
		if name := t.RetryQueue(d); seen[name] {
			bad("dlx: two retry tiers share the queue name %q", name)
		} else {
			seen[name] = true
		}
	}
	return errors.Join(errs...)
}

// singleDelayCycles refuses what makes the single-delay layout's work queue
// dead-letter a message it did not reject: Q dead-letters everything into
// Q.retry, whose TTL sends it back to Q, and RabbitMQ drops without a word a
// message that goes round a dead-letter cycle with no rejection in it
// (tested on 3.10.8, 4.0.5 and 4.3.6: work queue, retry queue and DLQ all
// empty).
func (t Topology) singleDelayCycles() []error {
	var errs []error
	cycle := fmt.Sprintf("with Topology.SingleRetryDelay, %s dead-letters everything into %s, whose TTL sends it back, and RabbitMQ drops "+
		"without a word a message that goes round such a cycle without a rejection", t.Queue, t.SingleRetryQueue())
	if t.DeliveryLimit > 0 {
		errs = append(errs, fmt.Errorf("dlx: Topology.DeliveryLimit %d: past it the broker dead-letters the message (reason delivery_limit), and %s: "+
			"use Topology.RetryDelays with DeliveryLimit, or listener.WithRedeliveryLimit, which hands such a message to the chain's recoverer (RejectToRetry's final) "+
			"before the broker's limit", t.DeliveryLimit, cycle))
	}
	overflow, _ := t.QueueArguments["x-overflow"].(string)
	for _, k := range slices.Sorted(maps.Keys(t.QueueArguments)) {
		why := ""
		switch k {
		case "x-message-ttl":
			why = "a message that expires on it is dead-lettered (reason expired)"
		case "x-delivery-limit":
			why = "past the limit the broker dead-letters the message (reason delivery_limit)"
		case "x-max-length", "x-max-length-bytes":
			if overflow == "" || overflow == "drop-head" || overflow == "reject-publish-dlx" {
				why = "a message dropped for length is dead-lettered (reason maxlen) unless x-overflow is reject-publish"
			}
		}
		if why != "" {
			errs = append(errs, fmt.Errorf("dlx: Topology.QueueArguments[%q]: %s, and %s: drop it, or use Topology.RetryDelays", k, why, cycle))
		}
	}
	return errs
}

// retryRefusedWhenFull refuses a classic work queue that refuses what its
// retry queues send back while it is full: a length limit with x-overflow
// reject-publish. The retry queue's TTL dead-letters the message back to the
// work queue, dead-lettering is not confirmed, and RabbitMQ drops what the
// full queue refuses without a word (tested on 3.10.8, 4.0.5 and 4.3.6:
// work queue, retry queue and DLQ without it). A quorum work queue takes
// such a message past its limit on those versions.
func (t Topology) retryRefusedWhenFull() error {
	if t.Type == Quorum || t.SkipWorkQueue || (len(t.RetryDelays) == 0 && t.SingleRetryDelay == 0) {
		return nil
	}
	_, count := t.QueueArguments["x-max-length"]
	_, bytes := t.QueueArguments["x-max-length-bytes"]
	if overflow, _ := t.QueueArguments["x-overflow"].(string); overflow != "reject-publish" || (!count && !bytes) {
		return nil
	}
	from, instead := "its retry tiers", `leave x-overflow out (drop-head dead-letters the oldest message to the DLQ), set it to "reject-publish-dlx" `+
		"(the refused retry goes to the DLQ), or use Type: dlx.Quorum"
	if t.SingleRetryDelay > 0 {
		from, instead = t.SingleRetryQueue(), "drop the length limit, or use Type: dlx.Quorum"
	}
	return fmt.Errorf(`dlx: Topology.QueueArguments["x-overflow"] = "reject-publish" with a length limit: a retry sent back by %s while the classic work queue %s is full `+
		"is refused, and RabbitMQ drops it without a word (dead-lettering is not confirmed): %s", from, t.Queue, instead)
}

// singleActiveArgument is the queue argument of single active consumer.
const singleActiveArgument = "x-single-active-consumer"

// ownedArgument is a work queue argument that Declare sets itself: a value
// in QueueArguments equal to it is harmless, another would be overwritten.
type ownedArgument struct {
	value any
	why   string
}

// workQueueArguments are the work queue's arguments that Declare sets
// itself, each with why another value in QueueArguments cannot have its way.
func (t Topology) workQueueArguments() map[string]ownedArgument {
	owned := map[string]ownedArgument{
		"x-queue-type": {string(cmp.Or(t.Type, Classic)), "the retry queues and the DLQ would not get it; set Topology.Type"},
	}
	dl := t.workDeadLettering()
	ex, key := dl["x-dead-letter-exchange"], dl["x-dead-letter-routing-key"]
	if t.SingleRetryDelay > 0 {
		owned["x-dead-letter-exchange"] = ownedArgument{ex, fmt.Sprintf("Declare sets it to %q, with Topology.SingleRetryDelay the work queue dead-letters into its retry queue", ex)}
		owned["x-dead-letter-routing-key"] = ownedArgument{key, fmt.Sprintf("Declare sets it to %q, with Topology.SingleRetryDelay the work queue dead-letters into its retry queue", key)}
	} else {
		owned["x-dead-letter-exchange"] = ownedArgument{ex, fmt.Sprintf("Declare sets it to the topology's DLX, %q; name that with Topology.DeadLetterExchange", ex)}
		owned["x-dead-letter-routing-key"] = ownedArgument{key, fmt.Sprintf("Declare sets it to the topology's DLQ routing key, %q; name that with Topology.DeadLetterRoutingKey", key)}
	}
	if t.Type == Quorum && t.DeliveryLimit > 0 {
		owned["x-delivery-limit"] = ownedArgument{int64(t.DeliveryLimit), fmt.Sprintf("Declare sets it to Topology.DeliveryLimit, %d", t.DeliveryLimit)}
	}
	if r := t.DelayedRedelivery; r != nil {
		for k, v := range r.arguments() {
			owned[k] = ownedArgument{v, fmt.Sprintf("Declare sets it to %s for Topology.DelayedRedelivery", quoted(v))}
		}
		owned["x-dead-letter-strategy"] = ownedArgument{"at-least-once", `Declare sets it to "at-least-once" for Topology.DelayedRedelivery, so that a message past the limit reaches the DLQ`}
		owned["x-overflow"] = ownedArgument{"reject-publish", `Declare sets it to "reject-publish", which at-least-once dead-lettering (Topology.DelayedRedelivery) needs`}
	}
	if t.SingleActiveConsumer {
		owned[singleActiveArgument] = ownedArgument{true, "Declare sets it to true for Topology.SingleActiveConsumer"}
	}
	if t.MaxPriority > 0 {
		owned["x-max-priority"] = ownedArgument{int64(t.MaxPriority), fmt.Sprintf("Declare sets it to Topology.MaxPriority, %d", t.MaxPriority)}
	}
	if t.Type == Quorum && t.AtLeastOnce {
		owned["x-dead-letter-strategy"] = ownedArgument{"at-least-once", `Declare sets it to "at-least-once" for Topology.AtLeastOnce`}
		owned["x-overflow"] = ownedArgument{"reject-publish", `Declare sets it to "reject-publish", which Topology.AtLeastOnce needs`}
	}
	return owned
}

// sameArgument reports whether a user's argument value is the one Declare
// sets, whatever Go integer type it was given as.
func sameArgument(given, set any) bool {
	if n, ok := amqphdr.Count(given); ok {
		if m, ok := amqphdr.Count(set); ok {
			return n == m
		}
	}
	return fmt.Sprint(given) == fmt.Sprint(set)
}

// workDeadLettering is where the work queue dead-letters: the DLX, or with
// SingleRetryDelay the retry queue, through the default exchange.
func (t Topology) workDeadLettering() amqp.Table {
	if t.SingleRetryDelay > 0 {
		return amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": t.SingleRetryQueue()}
	}
	return amqp.Table{"x-dead-letter-exchange": t.DLX(), "x-dead-letter-routing-key": t.DLQRoutingKey()}
}

// quoted writes an argument's value as Go would: strings in quotes.
func quoted(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// Declare declares the topology on ch, idempotently: run it at startup or
// pass it to listener.WithDeclare so it runs on every connection. A queue or
// exchange that exists with other arguments gives a *ConflictError that
// names it, the argument and the fix; the broker closes ch then.
//
// With DelayedRedelivery it needs to know the broker (older ones accept the
// delayed-retry arguments and ignore them): it does on the channels the
// listener opens (listener.WithDeclare) and with DeclareOn; on a channel of
// your own it returns a *VersionError.
func (t Topology) Declare(ch *amqp.Channel) error {
	if err := t.Validate(); err != nil {
		return err
	}
	if tiers, err := t.useTiers(amqpconn.ChannelVersion(ch)); err != nil {
		return err
	} else if tiers {
		return t.TierEquivalent().Declare(ch)
	}
	if t.Exchange != "" {
		if err := ch.ExchangeDeclare(t.Exchange, cmp.Or(t.ExchangeKind, "direct"), true, false, false, false, nil); err != nil {
			return conflict("exchange", t.Exchange, err)
		}
	}
	if err := ch.ExchangeDeclare(t.DLX(), "direct", true, false, false, false, nil); err != nil {
		return conflict("exchange", t.DLX(), err)
	}
	if err := t.declareQueue(ch, t.DLQ(), t.dlqArguments(), false); err != nil {
		return t.explainDLQLimitConflict(err)
	}
	if err := ch.QueueBind(t.DLQ(), t.DLQRoutingKey(), t.DLX(), false, nil); err != nil {
		return fmt.Errorf("dlx: bind %s to %s: %w", t.DLQ(), t.DLX(), err)
	}
	backToWork := func(ttl time.Duration) amqp.Table {
		return amqp.Table{
			"x-message-ttl":             ttl.Milliseconds(),
			"x-dead-letter-exchange":    "", // the default exchange: to the work queue only
			"x-dead-letter-routing-key": t.Queue,
		}
	}
	for _, d := range t.RetryDelays {
		if err := t.declareQueue(ch, t.RetryQueue(d), backToWork(d), true); err != nil {
			return err
		}
	}
	if t.SingleRetryDelay > 0 {
		if err := t.declareQueue(ch, t.SingleRetryQueue(), backToWork(t.SingleRetryDelay), true); err != nil {
			return err
		}
	}
	if !t.SkipWorkQueue {
		args := amqp.Table{}
		for k, v := range t.QueueArguments {
			args[k] = v
		}
		for k, v := range t.workDeadLettering() {
			args[k] = v
		}
		if r := t.DelayedRedelivery; r != nil {
			for k, v := range r.arguments() {
				args[k] = v
			}
			args["x-dead-letter-strategy"] = "at-least-once"
			args["x-overflow"] = "reject-publish"
		}
		if t.MaxPriority > 0 {
			args["x-max-priority"] = int64(t.MaxPriority)
		}
		if t.SingleActiveConsumer {
			args[singleActiveArgument] = true
		}
		if err := t.declareQueue(ch, t.Queue, args, true); err != nil {
			return err
		}
		if sac, _ := args[singleActiveArgument].(bool); sac {
			// for the listener that runs this declaration (WithDeclare)
			amqpconn.NoteSingleActive(ch, t.Queue)
		}
		if t.Exchange != "" {
			keys := t.BindingKeys
			if len(keys) == 0 {
				keys = []string{t.Queue}
			}
			for _, key := range keys {
				if err := ch.QueueBind(t.Queue, key, t.Exchange, false, nil); err != nil {
					return fmt.Errorf("dlx: bind %s to %s with %q: %w", t.Queue, t.Exchange, key, err)
				}
			}
		}
	}
	// RabbitMQ silently drops dead letters sent to an exchange that does not
	// exist: make sure ours does, now that everything pointing at it does.
	if err := ch.ExchangeDeclarePassive(t.DLX(), "direct", true, false, false, false, nil); err != nil {
		return fmt.Errorf("dlx: the dead-letter exchange %s is missing after declaring it (deleted concurrently?): %w", t.DLX(), err)
	}
	return nil
}

// dlqDeliveryLimit is a quorum DLQ's x-delivery-limit: a look at a dead
// letter hands it back, which RabbitMQ 4.0 counts as a delivery, so the DLQ
// must not have RabbitMQ 4's default of 20. -1 would be unlimited on 4 but
// makes 3.10 drop a message at its first return; MaxInt32 keeps it on both.
const dlqDeliveryLimit = int64(math.MaxInt32)

// dlqArguments are the DLQ's arguments before declareQueue adds its type.
func (t Topology) dlqArguments() amqp.Table {
	args := amqp.Table{}
	for k, v := range t.DLQArguments {
		args[k] = v
	}
	if _, own := args["x-delivery-limit"]; t.Type == Quorum && !own && !t.DLQWithBrokerDefaultLimit {
		args["x-delivery-limit"] = dlqDeliveryLimit
	}
	return args
}

// explainDLQLimitConflict says what to do when the DLQ exists without the
// x-delivery-limit dlqArguments gives it: a quorum DLQ declared by a version
// of the library before that default, which every upgrade meets once.
func (t Topology) explainDLQLimitConflict(err error) error {
	var ce *ConflictError
	_, own := t.DLQArguments["x-delivery-limit"]
	if !errors.As(err, &ce) || ce.Argument != "x-delivery-limit" || own || t.Type != Quorum || t.DLQWithBrokerDefaultLimit ||
		!strings.Contains(ce.Reason, "current is none") {
		return err
	}
	ce.explanation = fmt.Sprintf("dlx: the quorum DLQ %[1]q was created without x-delivery-limit (%[2]s); "+
		"dlx.Topology now declares it with x-delivery-limit %[3]d because on RabbitMQ 4 a quorum queue without one has a limit of 20, "+
		"every look at a dead letter (amqpretry dlq list or show, Replay skipping it) counts as a delivery, and the broker drops a dead letter after 20. "+
		"Queue arguments cannot change after creation. Keep the DLQ and its dead letters: set Topology.DLQWithBrokerDefaultLimit to declare it as it is "+
		"(safe on RabbitMQ 3.x, which has no default limit) and, for RabbitMQ 4, give it the limit by a policy, which needs no redeclaration: "+
		"rabbitmqctl set_policy %[4]s '^%[5]s$' '{\"delivery-limit\": %[3]d}' --apply-to quorum_queues "+
		"(a queue takes one policy: merge this into any that already matches it). "+
		"Or empty %[1]s and delete it so that it is declared again: amqpretry dlq replay %[1]s sends the dead letters back to their queues "+
		"(--to QUEUE to another existing queue), both without their fault headers, then rabbitmqctl delete_queue %[1]s --if-empty",
		ce.Name, ce.Reason, dlqDeliveryLimit, ce.Name+"-delivery-limit", regexp.QuoteMeta(ce.Name))
	return ce
}

// declareQueue declares a durable queue of the topology's type;
// deadLetters marks a queue that dead-letters (for at-least-once and the
// delivery limit: only those have somewhere to send what they give up on).
func (t Topology) declareQueue(ch *amqp.Channel, name string, extra amqp.Table, deadLetters bool) error {
	args := amqp.Table{}
	for k, v := range extra {
		args[k] = v
	}
	if t.Type == Quorum {
		args["x-queue-type"] = string(Quorum)
		if t.DeliveryLimit > 0 && deadLetters {
			args["x-delivery-limit"] = int64(t.DeliveryLimit)
		}
		if t.AtLeastOnce && deadLetters {
			args["x-dead-letter-strategy"] = "at-least-once"
			args["x-overflow"] = "reject-publish"
		}
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		return conflict("queue", name, err)
	}
	return nil
}

// ConflictError: a queue or exchange exists with arguments other than the
// topology's. Queue arguments cannot change once a queue exists.
type ConflictError struct {
	Kind     string // "queue" or "exchange"
	Name     string
	Argument string // the argument the broker named, if it did
	Reason   string // the broker's text

	Err *amqp.Error // the broker's refusal

	explanation string // replaces the generic advice when Declare knows better
}

// Unwrap returns the broker's *amqp.Error (406 PRECONDITION_FAILED).
func (e *ConflictError) Unwrap() error {
	if e.Err == nil {
		return nil
	}
	return e.Err
}

func (e *ConflictError) Error() string {
	if e.explanation != "" {
		return e.explanation
	}
	arg := "arguments"
	if e.Argument != "" {
		arg = e.Argument
	}
	fix := fmt.Sprintf("keep it as it is with Topology.SkipWorkQueue (if it is the work queue: only the DLX, DLQ and retry queues are declared then), "+
		"delete it (rabbitmqctl delete_queue %s) so it is declared again — which deletes its messages: move them first (amqpretry dlq replay %s --to ...) — "+
		"or change the Topology to match it", e.Name, e.Name)
	if e.Kind == "exchange" {
		fix = "delete it (management UI, rabbitmqadmin) so it is declared again, or change the Topology to match it"
	}
	return fmt.Sprintf("dlx: %s %q already exists with a different %s (%s); %s arguments cannot change after creation: %s",
		e.Kind, e.Name, arg, e.Reason, e.Kind, fix)
}

var inequivalentArg = regexp.MustCompile(`inequivalent arg '([^']+)'`)

// conflict turns a PRECONDITION_FAILED from a declaration into a
// *ConflictError; other errors are returned with the name added.
func conflict(kind, name string, err error) error {
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed {
		ce := &ConflictError{Kind: kind, Name: name, Reason: aerr.Reason, Err: aerr}
		if m := inequivalentArg.FindStringSubmatch(aerr.Reason); m != nil {
			ce.Argument = m[1]
		}
		return ce
	}
	return fmt.Errorf("dlx: declare %s %s: %w", kind, name, err)
}
