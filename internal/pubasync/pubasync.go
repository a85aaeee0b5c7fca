// Package pubasync lets the module's recoverers publish asynchronously
// through a *publisher.Publisher with the mandatory flag and a timeout given
// as arguments rather than as layers of context (publisher.WithMandatoryContext,
// context.WithTimeout), which cost a timer, a context and a watch on it per
// message on the poison path. The publisher package sets Publish as it is
// initialised; importing it (as the recoverers do, for the Publisher type)
// makes it available.
package pubasync

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Publish is p.PublishAsync(ctx, exchange, key, msg, done) for p a
// *publisher.Publisher, publishing with mandatory as given and, when timeout
// is above zero, bounded by it as by context.WithTimeout(ctx, timeout).
var Publish func(p any, ctx context.Context, exchange, key string, msg amqp.Publishing, mandatory bool, timeout time.Duration, done func(error)) error
