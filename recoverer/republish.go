package recoverer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/amqptable"
	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/internal/pubasync"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/publisher"
)

// Spring AMQP's fault header names.
const (
	HeaderExceptionMessage    = "x-exception-message"
	HeaderExceptionStacktrace = "x-exception-stacktrace"
	HeaderOriginalExchange    = amqphdr.OriginalExchange
	HeaderOriginalRoutingKey  = amqphdr.OriginalRoutingKey
)

// DefaultHeaderPrefix prefixes the fault headers that are ours.
const DefaultHeaderPrefix = "x-amqpretry-"

// Suffixes of our fault headers, after the prefix.
const (
	SuffixOriginalQueue      = "original-queue"
	SuffixErrorType          = "error-type"
	SuffixAttempts           = "attempts"
	SuffixFailedAt           = "failed-at"
	SuffixHost               = "host"
	SuffixOriginalExpiration = "original-expiration"
	SuffixOriginalUserID     = "original-user-id"
	// SuffixOriginalCC keeps the CC header of a message published with
	// one: the copy leaves CC and BCC out, since the broker would route it
	// to them again (RabbitMQ's own dead-lettering drops them too).
	SuffixOriginalCC = "original-cc"
	// SuffixRetryRule names the rule of middleware.Retry that applied to
	// the last failure (middleware.RuleApplied): a middleware.ErrorClass's
	// name, or "default"; written only when the Retry has rules.
	SuffixRetryRule = "retry-rule"
	// SuffixDroppedHeaders lists, comma-separated, the message's own
	// headers left out of a dead letter because with them it would not fit
	// in a frame (rare: headers that nearly fill frame_max by themselves).
	SuffixDroppedHeaders = "dropped-headers"
)

// DefaultHeadroom is what Republish leaves free in a frame for the other
// properties and the frame's own overhead, as Spring AMQP does.
const DefaultHeadroom = 20000

// Republisher is a middleware.Recoverer that publishes a copy of a failed
// message, annotated with fault headers, and waits for the broker's confirm.
type Republisher struct {
	pub        Publisher
	exchange   string
	routingKey string
	cfg        config
	host       any // the host name, boxed once for the header table
	keys       faultKeys
	boxes      *faultBoxes
	fixedWhere string // where(routingKey), when routingKey is fixed
}

// faultBoxes keep the fault headers' values boxed while they repeat (see
// internedString).
type faultBoxes struct {
	exchange, key, queue, errorType, message, stack internedString
}

// faultKeys are the names of our fault headers, the prefix joined once.
type faultKeys struct {
	originalQueue, errorType, attempts, retryRule, failedAt, host, originalExpiration, originalUserID, originalCC, droppedHeaders string
}

func newFaultKeys(prefix string) faultKeys {
	return faultKeys{
		originalQueue:      prefix + SuffixOriginalQueue,
		errorType:          prefix + SuffixErrorType,
		attempts:           prefix + SuffixAttempts,
		retryRule:          prefix + SuffixRetryRule,
		failedAt:           prefix + SuffixFailedAt,
		host:               prefix + SuffixHost,
		originalExpiration: prefix + SuffixOriginalExpiration,
		originalUserID:     prefix + SuffixOriginalUserID,
		originalCC:         prefix + SuffixOriginalCC,
		droppedHeaders:     prefix + SuffixDroppedHeaders,
	}
}

var _ middleware.Recoverer = (*Republisher)(nil)

// Publisher is what Republish, dlx.Topology.Tiers and dlx.Replay need of a
// publisher. *publisher.Publisher is one; tests can use a fake.
type Publisher interface {
	// Publish returns nil once the broker has confirmed msg; any other
	// outcome (unroutable, nacked, no confirm) is an error.
	Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error
	// FrameMax is the frame_max negotiated with the broker, which bounds a
	// copy's headers; 0 means RabbitMQ's default, 131072.
	FrameMax() int
	// Username is the user it publishes as: a copy keeps no user-id naming
	// anyone else, since RabbitMQ refuses it.
	Username() string
}

var _ Publisher = (*publisher.Publisher)(nil)

// Republish returns a Recoverer that publishes failed messages to exchange
// with routingKey. With routingKey "" it uses the delivery's own key, except
// for a delivery that came through the default exchange, whose key is a
// queue's name: back from a retry tier or a reject-to-retry round trip, it is
// the work queue's, which a DLX bound by the producers' keys would return as
// unroutable. For those it uses the key the message was first published
// with, as x-original-routingKey (written when an earlier recovery sent it to
// a retry tier) or else the first death of its x-death header records it.
// Use exchange ""
// and the DLQ's name as routingKey to publish straight to a queue.
//
// It panics if pub is nil or an option is invalid, naming every invalid one;
// what depends on the broker (the room frame_max leaves for headers) is an
// error of Recover.
func Republish(pub Publisher, exchange, routingKey string, opts ...Option) *Republisher {
	cfg := defaultConfig()
	for _, opt := range opts {
		opt(&cfg)
	}
	var errs []error
	if p, ok := pub.(*publisher.Publisher); pub == nil || (ok && p == nil) {
		errs = append(errs, errors.New("recoverer: Republish expects a non-nil *publisher.Publisher"))
	}
	if err := cfg.validate(); err != nil {
		errs = append(errs, err)
	}
	if len(exchange) > amqptable.MaxShortString || len(routingKey) > amqptable.MaxShortString {
		errs = append(errs, fmt.Errorf("recoverer: Republish expects an exchange and routing key of at most %d bytes, got %d and %d",
			amqptable.MaxShortString, len(exchange), len(routingKey)))
	}
	if len(errs) > 0 {
		panic(errors.Join(errs...).Error())
	}
	host, _ := os.Hostname()
	r := &Republisher{pub: pub, exchange: exchange, routingKey: routingKey, cfg: cfg, host: host, keys: newFaultKeys(cfg.prefix), boxes: new(faultBoxes)}
	if routingKey != "" {
		r.fixedWhere = r.where(routingKey)
	}
	return r
}

// Recover publishes the annotated copy and returns nil once the broker has
// confirmed it. Any other outcome (unroutable, nacked, no confirm within the
// publish timeout, headers too large) is an error, and the listener requeues
// the original.
func (r *Republisher) Recover(ctx context.Context, d *amqp.Delivery, cause error) error {
	msg, err := r.Message(ctx, d, cause)
	if err != nil {
		return err
	}
	key := r.key(d)
	ctx, cancel := context.WithTimeout(ctx, r.cfg.publishTimeout)
	defer cancel()
	// A dead letter no queue takes must be an error, whatever the
	// publisher does for the events it publishes (publisher.WithMandatory).
	if err := r.pub.Publish(publisher.WithMandatoryContext(ctx, true), r.exchange, key, msg); err != nil {
		return r.publishFailed(key, err)
	}
	chainctx.RecoveredTo(ctx, r.where(key), FailedAttempts(ctx, cause))
	return nil
}

// RecoverAsync is Recover without the wait for the confirm
// (middleware.AsyncRecoverer): it publishes the copy and returns, and done
// hears the outcome when the confirm (or a nack, a return, the publish
// timeout) comes. Through middleware.Recover in a listener's chain, the
// listener goes on reading meanwhile and acks the original when done says
// nil. It does so with a *publisher.Publisher only: a Publisher of your own
// (a wrapper that counts, say, even one embedding a *publisher.Publisher)
// is called as it expects, through Publish: it says it cannot (started
// false), and Recover runs instead.
func (r *Republisher) RecoverAsync(ctx context.Context, d *amqp.Delivery, cause error, done func(error)) (started bool, err error) {
	ap, ok := r.pub.(*publisher.Publisher)
	if !ok {
		return false, nil
	}
	msg, err := r.Message(ctx, d, cause)
	if err != nil {
		return false, err
	}
	key := r.key(d)
	attempts := FailedAttempts(ctx, cause) // read now, on the chain's goroutine
	// As Recover's PublishAsync(WithMandatoryContext(WithTimeout(ctx))),
	// without the timer and the two contexts per copy.
	err = pubasync.Publish(ap, ctx, r.exchange, key, msg, true, r.cfg.publishTimeout, func(err error) {
		if err != nil {
			done(r.publishFailed(key, err))
			return
		}
		chainctx.RecoveredTo(ctx, r.where(key), attempts)
		done(nil)
	})
	if err != nil { // nothing was sent, and done is not called
		return false, r.publishFailed(key, err)
	}
	return true, nil
}

// key is the routing key of d's copy.
func (r *Republisher) key(d *amqp.Delivery) string {
	if r.routingKey != "" {
		return r.routingKey
	}
	if d.Exchange == "" {
		// Through the default exchange the key is a queue's name: back
		// from a retry tier or a reject-to-retry round trip, the work
		// queue's. A DLX bound by producer keys needs theirs. A message
		// that came by a named exchange (a delay queue dead-lettering
		// into it, say) keeps the key it came with.
		_, key := amqphdr.OriginalDestination(d)
		return key
	}
	return d.RoutingKey
}

func (r *Republisher) publishFailed(key string, err error) error {
	return fmt.Errorf("recoverer: republish to exchange %q with routing key %q: %w", r.exchange, key, err)
}

// where says where a copy went, for the log.
func (r *Republisher) where(key string) string {
	if key == r.routingKey && r.fixedWhere != "" {
		return r.fixedWhere // a fixed key: said once, not per copy
	}
	exchange := r.exchange
	if exchange == "" {
		exchange = "(the default exchange)"
	}
	return exchange + ", routing key " + key
}

// Message builds the copy Recover publishes: exported so that other
// recoverers (broker retry tiers) and tests can reuse it.
func (r *Republisher) Message(ctx context.Context, d *amqp.Delivery, cause error) (amqp.Publishing, error) {
	if d == nil {
		return amqp.Publishing{}, errors.New("recoverer: nil delivery")
	}
	if err := r.checkRoom(); err != nil {
		return amqp.Publishing{}, err
	}
	if cause == nil {
		cause = errors.New("no error given")
	}
	headers := make(amqp.Table, len(d.Headers)+12)
	for k, v := range d.Headers {
		if !amqphdr.IsBrokerOwned(k) && !amqphdr.IsSenderRouting(k) { // set by RabbitMQ; routed by it again on every hop
			headers[k] = v
		}
	}
	if cc, ok := d.Headers[amqphdr.CC]; ok {
		headers[r.keys.originalCC] = cc
	}
	// A message that failed before carries the old fault text; it is replaced,
	// and must not be counted against the budget twice.
	delete(headers, HeaderExceptionMessage)
	delete(headers, HeaderExceptionStacktrace)
	for _, extra := range r.cfg.extra {
		for k, v := range extra(ctx, d, cause) {
			headers[k] = v
		}
	}
	handlerErr := chainrun.HandlerError(cause)
	keys, boxes := &r.keys, r.boxes
	// A message on a retry hop (a tier, a reject-to-retry cycle) was
	// republished or dead-lettered already: keep where it was first sent.
	exchange, key := amqphdr.OriginalDestination(d)
	headers[HeaderOriginalExchange] = boxes.exchange.box(exchange)
	headers[HeaderOriginalRoutingKey] = boxes.key.box(key)
	headers[keys.originalQueue] = boxes.queue.box(chainctx.Queue(ctx))
	headers[keys.errorType] = boxes.errorType.box(chainrun.ErrorType(cause))
	headers[keys.attempts] = int64(FailedAttempts(ctx, cause))
	if rule := middleware.RuleApplied(ctx, cause); rule != "" {
		headers[keys.retryRule] = rule
	} else {
		delete(headers, keys.retryRule) // from an earlier failure, under another chain
	}
	headers[keys.failedAt] = time.Now().UTC().Format(time.RFC3339Nano)
	headers[keys.host] = r.host

	msg := amqptable.Publishing(d)
	msg.DeliveryMode = amqp.Persistent
	if d.Expiration != "" {
		headers[keys.originalExpiration] = d.Expiration // dead letters must not expire
	}
	if d.UserId != "" && d.UserId != r.pub.Username() {
		headers[keys.originalUserID] = d.UserId
		msg.UserId = ""
	}

	// A header that cannot be published (nested deeper than amqp091-go
	// reads, a type AMQP lacks) is left out and named, as one too large
	// for the frame is: refusing the copy would requeue the message for ever.
	headers, unwritable := amqptable.NormalizeDropping(headers)
	if len(unwritable) > 0 {
		headers[keys.droppedHeaders] = droppedList(unwritable, keys.droppedHeaders)
	}
	// amqp091-go reads at most MaxEntries headers: a copy that the fault
	// text pushes past them could not be read off the DLQ.
	if len(headers)+laterEntries > amqptable.MaxEntries {
		headers, unwritable = dropToCount(headers, amqptable.MaxEntries-laterEntries, keys.droppedHeaders, r.ownKeys(), unwritable)
	}
	var stackBox any
	stack := ""
	if r.cfg.stackTrace {
		stackBox = stackTraceBox(cause, &boxes.stack)
		stack = stackBox.(string)
	}
	budget, size := r.headerBudget(msg), amqptable.Size(headers)
	if budget-size < faultTextFloor {
		// The message's own headers fill the frame past the headroom. The
		// headroom is a margin, not a must: a dead letter that cannot be
		// written would loop for ever, so use all the frame leaves, and
		// if even that is too little, drop headers (the largest first,
		// ours last) and say which.
		budget = r.exactHeaderBudget(msg)
		headers = dropToFit(headers, budget-faultTextFloor, keys.droppedHeaders, r.ownKeys(), unwritable)
		size = amqptable.Size(headers)
	}
	message, fitted, err := fitFaultText(budget-size, ErrorString(handlerErr), stack, r.cfg.stackTrace)
	if err != nil {
		return amqp.Publishing{}, err
	}
	headers[HeaderExceptionMessage] = boxes.message.box(message)
	if r.cfg.stackTrace {
		if fitted == stack {
			headers[HeaderExceptionStacktrace] = stackBox
		} else {
			headers[HeaderExceptionStacktrace] = fitted // cut: this copy's own
		}
	}
	msg.Headers = headers
	return msg, nil
}

// headerBudget is the room for the whole header table: frame_max minus the
// headroom, and never more than what the frame has left after msg's other
// properties (headers are not counted from msg).
func (r *Republisher) headerBudget(msg amqp.Publishing) int {
	return min(r.frameMax()-r.cfg.headroom, r.exactHeaderBudget(msg))
}

// exactHeaderBudget is what the frame leaves for the header table after
// msg's other properties and the trace headers.
func (r *Republisher) exactHeaderBudget(msg amqp.Publishing) int {
	msg.Headers = nil
	return r.frameMax() - amqptable.FrameOverhead - amqptable.PropertiesSize(msg) - propagationReserve
}

// faultTextFloor is the least room left for the exception message and stack
// trace (their keys included) before Message stops honouring the headroom.
const faultTextFloor = 1024

// ownKeys are the fault headers Message writes, dropped last.
func (r *Republisher) ownKeys() map[string]bool {
	k := &r.keys
	return map[string]bool{HeaderOriginalExchange: true, HeaderOriginalRoutingKey: true, k.originalQueue: true, k.errorType: true,
		k.attempts: true, k.retryRule: true, k.failedAt: true, k.host: true, k.originalExpiration: true, k.originalUserID: true, k.originalCC: true}
}

// dropToFit drops headers, the largest first and ours last, until the table
// takes at most budget bytes with the list of what was dropped (after the
// names in before, dropped already), which it adds under listKey. It leaves
// headers as it is when it fits.
func dropToFit(headers amqp.Table, budget int, listKey string, ours map[string]bool, before []string) amqp.Table {
	if amqptable.Size(headers) <= budget {
		return headers
	}
	ours = maps.Clone(ours)
	ours[listKey] = true // the list itself is kept and rewritten
	keys := slices.SortedFunc(maps.Keys(headers), func(a, b string) int {
		if ours[a] != ours[b] {
			if ours[a] {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(amqptable.FieldSize(headers[b])+len(b), amqptable.FieldSize(headers[a])+len(a)), strings.Compare(a, b))
	})
	out := maps.Clone(headers)
	delete(out, listKey)
	dropped := slices.Clone(before)
	for _, k := range keys {
		if amqptable.Size(out)+listRoom <= budget {
			break
		}
		if k == listKey {
			continue
		}
		delete(out, k)
		dropped = append(dropped, k)
	}
	out[listKey] = droppedList(dropped, listKey)
	return out
}

// laterEntries are the headers added after the count is checked: the
// exception message and stack trace, and the publisher's trace headers
// (traceparent, tracestate, baggage).
const laterEntries = 5

// dropToCount drops the message's own headers, the largest first, until
// the table has at most n entries with the list of what was dropped (after
// the names in before), which it adds under listKey; it returns the table
// and the whole list.
func dropToCount(headers amqp.Table, n int, listKey string, ours map[string]bool, before []string) (amqp.Table, []string) {
	out := maps.Clone(headers)
	delete(out, listKey)
	dropped := slices.Clone(before)
	for _, k := range slices.SortedFunc(maps.Keys(out), func(a, b string) int {
		return cmp.Or(cmp.Compare(amqptable.FieldSize(out[b])+len(b), amqptable.FieldSize(out[a])+len(a)), strings.Compare(a, b))
	}) {
		if len(out)+1 <= n {
			break
		}
		if !ours[k] {
			delete(out, k)
			dropped = append(dropped, k)
		}
	}
	out[listKey] = droppedList(dropped, listKey)
	return out, dropped
}

// listRoom is what the list of dropped headers may take, its key included.
const listRoom = 1024

// droppedList is the value of the dropped-headers header: the names,
// comma-separated, made valid UTF-8 and cut to fit listRoom.
func droppedList(names []string, listKey string) string {
	list := strings.ToValidUTF8(strings.Join(names, ","), "\uFFFD")
	return cut(list, listRoom-entrySize(listKey)-8)
}

// propagationReserve leaves room for the trace headers (traceparent,
// tracestate, baggage) the publisher adds to the copy.
const propagationReserve = 1024

func (r *Republisher) frameMax() int {
	if fm := r.pub.FrameMax(); fm > 0 {
		return fm
	}
	return 131072 // RabbitMQ's default
}

// checkRoom reports a headroom that leaves too little of the broker's
// frame_max for the headers: a broker setting, so an error of the recovery
// (the listener requeues the message), not a panic at construction.
func (r *Republisher) checkRoom() error {
	if room := r.frameMax() - r.cfg.headroom; room < minHeaderRoom {
		return fmt.Errorf("recoverer: WithHeadroom(%d) leaves %d bytes of the broker's frame_max (%d) for headers; leave at least %d",
			r.cfg.headroom, room, r.frameMax(), minHeaderRoom)
	}
	return nil
}

// minHeaderRoom is the least a headroom may leave for headers.
const minHeaderRoom = 4096

// FailedAttempts is how many attempts failed before the recovery, the value
// of the attempts fault header: the count in Retry's error when Recover sits
// outside Retry (chainrun.AttemptsMade), else the attempt in progress
// (middleware.Attempt).
func FailedAttempts(ctx context.Context, cause error) int {
	if n, ok := chainrun.AttemptsMade(cause); ok {
		return n
	}
	return middleware.Attempt(ctx)
}
