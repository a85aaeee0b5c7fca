package main

import (
	"context"
	"fmt"
	"io"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/listener"
)

// The coalescing section drains a filled queue on each broker (-url's and
// -retry-url's: RabbitMQ 3.10 and 4.3 under make bench) four ways: raw
// amqp091-go acking each delivery, raw amqp091-go with one
// Ack(multiple=true) per quarter of the prefetch (62 of 250), and the
// listener without and with WithAckCoalescing of as many. The raw coalesced
// loop is the limit: the least a Go client does per message when it acks
// together.

// coalesceDelay is the listener's WithAckCoalescing delay in the bench: at
// full speed the count writes every ack long before it.
const coalesceDelay = 50 * time.Millisecond

// coalesceEvery is how many deliveries one ack covers: a quarter of the
// prefetch, as the issue measured (62 of 250).
func (c Config) coalesceEvery() int { return max(2, c.Prefetch/4) }

// CoalesceResult is the section on one broker.
type CoalesceResult struct {
	URL    string `json:"url"`              // the password hidden
	Broker string `json:"broker,omitempty"` // "RabbitMQ 3.10.8"
	// Skipped says why the section did not run on this broker.
	Skipped  string      `json:"skipped,omitempty"`
	AckEvery int         `json:"ack_every"`
	Flood    *Comparison `json:"drain,omitempty"`
	Goals    []Goal      `json:"goals,omitempty"`
}

func coalesceVariants(e *env) []variant {
	every := e.cfg.coalesceEvery()
	vs := []variant{
		{name: "raw", run: consumeRaw,
			about: fmt.Sprintf("amqp091-go: %d consumers, each its own channel with Qos(%d), ack one by one", e.cfg.Consumers, e.cfg.Prefetch)},
		{name: "raw-coalesced", run: consumeRawCoalesced,
			about: fmt.Sprintf("as raw, with one Ack(multiple=true) per %d deliveries", every)},
		{name: "listener", run: consumeListener,
			about: "listener, Chain(Retry(5), Recover(Republish)), as in the happy path, each delivery acked at once"},
		{name: "listener-coalesced", run: consumeListenerCoalesced,
			about: fmt.Sprintf("as listener, with WithAckCoalescing(%d, %v)", every, coalesceDelay)},
	}
	for i := range vs {
		vs[i].skip = e.cfg.Skip[vs[i].name]
	}
	return vs
}

// coalesceVariantNames are the section's own variants, by the names -skip
// takes (raw and listener are the happy path's too).
func coalesceVariantNames() []string { return []string{"raw-coalesced", "listener-coalesced"} }

// consumeRawCoalesced acks every coalesceEvery-th delivery with multiple
// set: what the ones before it on the channel wait for. The last run of a
// channel stays unacked when the count is reached; the broker takes it back
// as the connection closes.
func consumeRawCoalesced(ctx context.Context, e *env, q string, n int) (Sample, error) {
	every := e.cfg.coalesceEvery()
	return consumeDirect(ctx, e, q, n, "raw-coalesced-", func() func(amqp.Delivery) {
		count := 0
		return func(d amqp.Delivery) {
			if count++; count%every == 0 {
				_ = d.Ack(true)
			}
		}
	})
}

func consumeListenerCoalesced(ctx context.Context, e *env, q string, n int) (Sample, error) {
	return consumeWithListener(ctx, e, q, n, listener.WithAckCoalescing(e.cfg.coalesceEvery(), coalesceDelay))
}

// measureCoalesce runs the section on the happy path's broker and on the
// retry section's; a broker that does not answer is skipped with a note.
func measureCoalesce(ctx context.Context, cfg Config) ([]*CoalesceResult, error) {
	var out []*CoalesceResult
	for _, url := range []string{cfg.URL, cfg.RetryURL} {
		res := &CoalesceResult{URL: redact(url), AckEvery: cfg.coalesceEvery()}
		out = append(out, res)
		b, err := dialBroker(url)
		if err != nil {
			res.Skipped = fmt.Sprintf("no broker answers at %s (%v)", res.URL, err)
			cfg.logf("coalesce: skipped: %s", res.Skipped)
			continue
		}
		v := amqpconn.VersionOf(b.conn.Properties)
		res.Broker = v.Product + " " + v.String()
		cfg.logf("coalesce on %s: %d messages, one ack per %d", res.Broker, cfg.Messages, res.AckEvery)
		e := &env{cfg: cfg, broker: b, brokerPID: brokerPID(url)}
		res.Flood, err = compare(ctx, e, sectionCoalesce+"-"+v.String(), coalesceVariants(e), cfg.Messages)
		_ = b.Close()
		if err != nil {
			return nil, err
		}
		res.Goals = coalesceGoals(res.Flood)
	}
	return out, nil
}

// coalesceGoals are issue 28's: the listener with coalescing at least 0.9×
// the raw coalesced loop and 1.2× raw per-message acks, and without it at
// least 0.95× raw.
func coalesceGoals(c *Comparison) []Goal {
	goals := []Goal{
		{Section: sectionCoalesce, Variant: "listener-coalesced", Measure: "msg/s", Against: "raw-coalesced", Limit: 0.9},
		{Section: sectionCoalesce, Variant: "listener-coalesced", Measure: "msg/s", Against: "raw", Limit: 1.2},
		{Section: sectionCoalesce, Variant: "listener", Measure: "msg/s", Against: "raw", Limit: 0.95},
	}
	for i := range goals {
		goals[i] = goals[i].evaluate(c)
	}
	return goals
}

// writeCoalesce prints the section, one table per broker.
func writeCoalesce(w io.Writer, results []*CoalesceResult, set Settings) {
	for _, cr := range results {
		if cr.Skipped != "" {
			fmt.Fprintf(w, "## Ack coalescing on %s: skipped\n\nSkipped: %s.\n\n", cr.URL, cr.Skipped)
			continue
		}
		c := cr.Flood
		fmt.Fprintf(w, "## Ack coalescing on %s: %d ready messages, %d consumers, prefetch %d, one ack per %d (median of %d rounds, each starting one variant further along)\n\n",
			cr.Broker, c.Messages, set.Consumers, set.Prefetch, cr.AckEvery, c.Rounds)
		writeComparison(w, c)
		writeGoals(w, "issue 28 on "+cr.Broker, cr.Goals)
	}
}
