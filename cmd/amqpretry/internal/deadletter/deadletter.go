package deadletter

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/recoverer"
)

// Look takes a snapshot of queue, as Peek does, and hands every message
// back before it returns (Return): what it returns are copies, the messages
// are on the queue again. Every look of the CLI goes through it; close the
// channel only after it returns. When the queue does not show them all back
// within SettleTimeout (someone else took some) the error says so, with the
// snapshot.
func Look(ctx context.Context, ch *amqp.Channel, queue string, limit int, stop func(amqp.Delivery) bool) ([]amqp.Delivery, error) {
	msgs, err := Peek(ctx, ch, queue, limit, stop)
	if err != nil {
		return nil, err
	}
	return msgs, Return(ctx, ch, queue, msgs)
}

// Return hands msgs, taken on ch from queue, back with one
// basic.nack(multiple, requeue) (HandBack) and waits until queue shows them
// ready again, so that the caller can close the channel. Closing it at once
// loses the race: the broker applies the nacks of a quorum queue after it
// has seen the channel close and returns the messages as if the look had
// been cut off. RabbitMQ 4.3 counts such a return toward the delivery limit
// where it does not count the nack (measured on 4.3.6 when a look read with
// basic.get, 20 looks at 200 dead letters: with individual nacks and the
// channel closed at once, 167 had x-delivery-count 14 to 17; with a passive
// declare between them 6 to 12; with one multiple nack 19 or 20; waiting for
// the depth, 0; reading with a consumer and waiting, 0 again:
// TestWhatALookCountsOnAQuorumQueue). RabbitMQ 3.10 and 4.0 count every
// hand-back, nack included, once per look, whatever the order (4.0's default
// limit of 20 drops a dead letter at its 21st look; see
// dlx.Topology.DLQArguments). Every version marks the messages redelivered.
//
// It waits even when ctx has ended (a look cut short by Ctrl-C), up to
// SettleTimeout: a message handed back is worth the wait.
func Return(ctx context.Context, ch *amqp.Channel, queue string, msgs []amqp.Delivery) error {
	if len(msgs) == 0 {
		return nil
	}
	// What is ready now is what the look left; once the nacks are applied,
	// it is that and every message handed back.
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	HandBack(msgs)
	if err != nil {
		return fmt.Errorf("queue %s: %w (the %d messages looked at were handed back; one that was cut off on its way back counts as a delivery)", queue, err, len(msgs))
	}
	want := q.Messages + len(msgs)
	got, err := Settle(context.WithoutCancel(ctx), ch, queue, want)
	if err != nil {
		return fmt.Errorf("queue %s: %w while waiting for the %d messages handed back", queue, err, len(msgs))
	}
	if got < want {
		return fmt.Errorf("queue %s shows %d ready messages %v after the look handed back %d, want %d: another consumer may have taken some; those not back yet count as a delivery on a quorum queue",
			queue, got, SettleTimeout, len(msgs), want)
	}
	return nil
}

// Peek takes messages from queue without acking them until stop says so,
// limit are taken (0: as many as the queue holds when Peek begins), the
// queue has no more ready messages, or ctx ends; HandBack puts them back
// where they were, Return puts them back and waits until the queue has them.
// On an error it has handed back what it took.
//
// It reads with a consumer (basic.consume, acks on) whose prefetch is the
// bound, so the broker streams the messages rather than answering one
// basic.get after another, and never sends more than the bound (up to
// 65,535, a prefetch's most). The queue's ready count when Peek begins is
// where it expects the stream to end: once it has that many, a pause of
// IdleWait ends the look; before that, the look ends only after a pause of
// StallWait with the queue showing none ready (another consumer took some).
// stop is not asked again once it has said stop. Deliveries on their way
// when the look ends are handed back at once. A look cut off (ctx ended,
// the channel or the connection closed) loses nothing: what it holds
// unacked goes back to the queue when the channel closes.
func Peek(ctx context.Context, ch *amqp.Channel, queue string, limit int, stop func(amqp.Delivery) bool) ([]amqp.Delivery, error) {
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("queue %s: %w", queue, err)
	}
	bound := limit
	if limit <= 0 {
		if bound = q.Messages; bound == 0 {
			return nil, nil
		}
	}
	if err := ch.Qos(min(bound, math.MaxUint16), 0, false); err != nil {
		return nil, fmt.Errorf("read %s: %w", queue, err)
	}
	tag := "amqpretry-look-" + rand.Text()
	// Consume, not ConsumeWithContext: that one leaves a goroutine per call
	// waiting for ctx or the channel's end.
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", queue, err)
	}
	out, err := take(ctx, ch, queue, deliveries, bound, q.Messages, stop)
	if cerr := ch.Cancel(tag, false); cerr != nil && err == nil {
		err = fmt.Errorf("read %s: %w", queue, cerr)
	}
	// What arrived before the cancel-ok: amqp091-go hands it on, then
	// closes deliveries (at once if the channel has closed).
	var extra []amqp.Delivery
	for d := range deliveries {
		extra = append(extra, d)
	}
	if err != nil {
		HandBack(append(out, extra...))
		return nil, err
	}
	if len(extra) > 0 {
		// Back at once, and counted before Peek returns: a classic queue
		// answers a count before the requeues sent ahead of it, and Return
		// (or the next look) would trust a count without these.
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		for _, d := range extra {
			_ = d.Nack(false, true)
		}
		if err == nil {
			_, err = Settle(ctx, ch, queue, q.Messages+len(extra))
		}
		if err != nil {
			HandBack(out)
			return nil, fmt.Errorf("queue %s: %w", queue, err)
		}
	}
	return out, nil
}

// IdleWait is how long a look waits for more deliveries once it has as
// many as the queue held when it began; a pause of IdleWait before that
// makes it ask the queue whether any are still ready.
const IdleWait = 50 * time.Millisecond

// StallWait is how long a look, short of what the queue held when it began,
// waits for more once the queue has none ready: the broker has sent them
// (a quorum queue reports them sent before they arrive) or another consumer
// took them.
const StallWait = time.Second

// take reads deliveries until it has bound, stop says so, a pause of
// IdleWait follows the expected count (or, before it, a pause of StallWait
// with the queue showing none ready), or ctx ends.
func take(ctx context.Context, ch *amqp.Channel, queue string, deliveries <-chan amqp.Delivery, bound, expected int, stop func(amqp.Delivery) bool) ([]amqp.Delivery, error) {
	out := make([]amqp.Delivery, 0, min(bound, max(expected, 1)))
	idle := time.NewTimer(IdleWait)
	defer idle.Stop()
	last := time.Now() // of the last delivery, or the start
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return out, fmt.Errorf("read %s: the channel closed during the look", queue)
			}
			out = append(out, d)
			if stopped := stop != nil && stop(d); stopped || len(out) >= bound {
				return out, nil
			}
			last = time.Now()
			idle.Reset(IdleWait)
		case <-idle.C:
			if len(out) >= expected {
				return out, nil
			}
			q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			if err != nil {
				return out, fmt.Errorf("queue %s: %w", queue, err)
			}
			if q.Messages == 0 && time.Since(last) >= StallWait {
				return out, nil
			}
			idle.Reset(IdleWait)
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
}

// HandBack returns peeked messages, all taken on one channel, to their
// queue with one basic.nack(multiple, requeue) on the last delivery tag:
// looking at a message is not its failure, and from RabbitMQ 4.3 a nack,
// unlike a reject or a closed channel, does not count toward a quorum DLQ's
// delivery limit, provided the broker has applied it before the channel
// closes: wait for that with Settle, or use Return. 4.0 counts it: a
// dlx.Topology's quorum DLQ has a limit too high to reach, any other quorum
// queue the broker's (20 on 4.x). The nack takes back every delivery of the
// channel up to the last tag: the channel must hold no other unsettled
// delivery of that range.
func HandBack(msgs []amqp.Delivery) {
	if len(msgs) == 0 {
		return
	}
	last := msgs[0]
	for _, d := range msgs[1:] {
		if d.DeliveryTag > last.DeliveryTag {
			last = d
		}
	}
	_ = last.Nack(true, true)
}

// Header is a header's value as text, raw, for matching and grouping: show
// it escaped (package escape).
func Header(d *amqp.Delivery, key string) string {
	if v, ok := d.Headers[key]; ok && v != nil {
		return fmt.Sprint(v)
	}
	return ""
}

// OriginalKey is the routing key a dead letter was first published with: as
// the recoverer recorded it, else as x-death does for one the broker made (a
// consumer's reject, an expiry), else its own.
func OriginalKey(d *amqp.Delivery) string {
	if k := Header(d, recoverer.HeaderOriginalRoutingKey); k != "" {
		return k
	}
	if _, key, ok := amqphdr.FirstPublished(d.Headers); ok {
		return key
	}
	return d.RoutingKey
}

// OriginalExchange is the exchange a dead letter was first published to, as
// the recoverer or x-death recorded it; "" when neither did (or it was the
// default exchange).
func OriginalExchange(d *amqp.Delivery) string {
	exchange, _, _ := amqphdr.FirstPublished(d.Headers)
	return exchange
}

// OriginalQueue is the queue a dead letter failed on: the recoverer's
// original-queue header (with prefix), else the queue RabbitMQ first
// dead-lettered it from.
func OriginalQueue(d *amqp.Delivery, prefix string) string {
	if q := Header(d, prefix+recoverer.SuffixOriginalQueue); q != "" {
		return q
	}
	if q, ok := d.Headers[amqphdr.XFirstDeathQueue].(string); ok && q != "" {
		return q
	}
	if deaths := amqphdr.Deaths(d.Headers); len(deaths) > 0 {
		return deaths[len(deaths)-1].Queue
	}
	return ""
}

// Exception is why a dead letter is one: the recoverer's exception message,
// else, for one RabbitMQ made, the reason of its latest death and the queue.
func Exception(d *amqp.Delivery) string {
	if e := Header(d, recoverer.HeaderExceptionMessage); e != "" {
		return e
	}
	if death, ok := LatestDeath(d); ok && death.Reason != "" {
		return fmt.Sprintf("%s (dead-lettered by RabbitMQ from %s)", reasonText(death.Reason), death.Queue)
	}
	return ""
}

// LatestDeath is the newest entry of d's x-death header, if any.
func LatestDeath(d *amqp.Delivery) (amqphdr.Death, bool) {
	deaths := amqphdr.Deaths(d.Headers)
	if len(deaths) == 0 {
		return amqphdr.Death{}, false
	}
	return deaths[0], true
}

func reasonText(reason string) string {
	switch reason {
	case "rejected":
		return "rejected by a consumer"
	case "expired":
		return "expired (its TTL ran out)"
	case "maxlen":
		return "dropped from a full queue (maxlen)"
	case "delivery_limit":
		return "over the queue's delivery limit (delivery_limit)"
	}
	return reason
}

// Result is what a Replay did, and how many messages it left on the queue.
type Result struct {
	dlx.ReplayStats
	// Left is the queue's depth after the replay; -1 when it could not be
	// read.
	Left int
}

// Replay checks that queue exists, runs dlx.Replay on it (each message
// published with pub and acked on the queue only once confirmed) and reads
// the depth it leaves, once the messages it looked at and left are back
// (Settle). A queue that is not there is an error before anything is taken;
// otherwise the Result counts what was done even when err is not nil.
func Replay(ctx context.Context, ch *amqp.Channel, pub recoverer.Publisher, queue string, opts ...dlx.ReplayOption) (Result, error) {
	res := Result{Left: -1}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return res, fmt.Errorf("queue %s: %w", queue, err)
	}
	stats, err := dlx.Replay(ctx, ch, pub, queue, opts...)
	res.ReplayStats = stats
	if left, serr := Settle(ctx, ch, queue, max(q.Messages, stats.Scanned)-stats.Replayed); serr == nil {
		res.Left = left
	}
	return res, err
}

// SettleTimeout bounds Settle's wait.
const SettleTimeout = 10 * time.Second

// Settle waits until queue reports at least want ready messages, or
// SettleTimeout passes (someone else took some), and returns the count. A
// classic queue answers a count before the requeues queued before it: right
// after a look hands 10,000 messages back it may report a few hundred, and
// a look or a replay that trusted that count would stop short.
func Settle(ctx context.Context, ch *amqp.Channel, queue string, want int) (int, error) {
	deadline := time.Now().Add(SettleTimeout)
	for {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return 0, fmt.Errorf("queue %s: %w", queue, err)
		}
		if q.Messages >= want || time.Now().After(deadline) {
			return q.Messages, nil
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return q.Messages, ctx.Err()
		case <-t.C:
		}
	}
}
