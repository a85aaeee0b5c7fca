package deadletter

import (
	"context"
	"fmt"
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

// Return hands msgs, taken on ch from queue, back with basic.nack(requeue)
// and waits until queue shows them ready again, so that the caller can close
// the channel. Closing it at once loses the race: the broker applies the
// nacks of a quorum queue after it has seen the channel close and returns
// the messages as if the look had been cut off. RabbitMQ 4.3 counts such a
// return toward the delivery limit where it does not count the nack
// (measured on 4.3.6, 20 looks at 200 dead letters: with individual nacks
// and the channel closed at once, 167 had x-delivery-count 14 to 17; with a
// passive declare between them 6 to 12; with one multiple nack 19 or 20;
// waiting for the depth, 0). RabbitMQ 3.10 and 4.0 count every hand-back,
// nack included, once per look, whatever the order (4.0's default limit of
// 20 drops a dead letter at its 21st look; see dlx.Topology.DLQArguments).
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
// limit are taken (0: as many as the queue holds when Peek begins) or ctx
// ends; HandBack puts them back where they were, Return puts them back and
// waits until the queue has them. On an error it has returned what it took.
//
// With a limit it takes until the queue has no more ready messages rather
// than as many as the queue reports: the count RabbitMQ reports may leave
// out messages handed back a moment ago (a classic queue answers the count
// before it has put back a look's messages), basic.get waits for them.
func Peek(ctx context.Context, ch *amqp.Channel, queue string, limit int, stop func(amqp.Delivery) bool) ([]amqp.Delivery, error) {
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("queue %s: %w", queue, err)
	}
	n := limit
	if limit <= 0 {
		n = q.Messages
	}
	var out []amqp.Delivery
	for range n {
		if err := ctx.Err(); err != nil {
			_ = Return(ctx, ch, queue, out)
			return nil, err
		}
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			_ = Return(ctx, ch, queue, out)
			return nil, fmt.Errorf("read %s: %w", queue, err)
		}
		if !ok {
			break
		}
		out = append(out, d)
		if stop != nil && stop(d) {
			break
		}
	}
	return out, nil
}

// HandBack returns peeked messages to their queue with basic.nack(requeue):
// looking at a message is not its failure, and from RabbitMQ 4.3 a nack,
// unlike a reject or a closed channel, does not count toward a quorum DLQ's
// delivery limit, provided the broker has applied it before the channel
// closes: wait for that with Settle, or use Return. 4.0 counts it: a dlx.Topology's quorum DLQ has a limit too
// high to reach, any other quorum queue the broker's (20 on 4.x).
func HandBack(msgs []amqp.Delivery) {
	for _, d := range msgs {
		_ = d.Nack(false, true)
	}
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
