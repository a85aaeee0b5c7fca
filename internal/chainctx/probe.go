package chainctx

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// WorstCaseWait reports the longest time the chain h (a chain of middlewares
// around a handler that succeeds at once) may keep one delivery waiting
// between attempts, handler time not included, as its Retries report it. The
// listener compares it with the broker's consumer_timeout.
//
// It calls h once with ProbeDelivery; a Retry recognises the dry run, adds
// its worst case to the Probe in the context and calls the rest of the chain
// with a Probe of its own, and Recover does nothing but pass the result up.
// Other middlewares run as they would for a message handled on the first
// attempt, and one that does not call next hides the Retries below it.
func WorstCaseWait(h func(context.Context, *amqp.Delivery) error) time.Duration {
	p := &Probe{}
	_ = h(WithProbe(context.Background(), p), ProbeDelivery)
	return p.Wait
}

// ProbeDelivery identifies WorstCaseWait's dry run by pointer, so that the
// hot path pays a pointer comparison rather than a context lookup.
var ProbeDelivery = &amqp.Delivery{}

// Probe collects the waits of the Retries of a dry run.
type Probe struct{ Wait time.Duration }

// WithProbe returns a context whose Retries report their waits to p.
func WithProbe(ctx context.Context, p *Probe) context.Context {
	return context.WithValue(ctx, probeKey, p)
}

// ProbeFrom returns the Probe of a dry run.
func ProbeFrom(ctx context.Context) (*Probe, bool) {
	p, ok := ctx.Value(probeKey).(*Probe)
	return p, ok
}
