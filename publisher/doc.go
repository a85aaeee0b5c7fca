// Package publisher publishes to RabbitMQ and returns only once the broker has
// confirmed the message: create one Publisher per process with New and call
// Publish from as many goroutines as you like.
//
// A Publisher owns its own connection (RabbitMQ advises separate connections
// for publishing and consuming, so that flow control on one does not stall the
// other), puts its channels in confirm mode and publishes with mandatory set.
// Publish returns nil only after a basic.ack; a basic.return gives
// ErrUnroutable, a basic.nack ErrNacked, a missing exchange an
// *ExchangeNotFoundError naming it. Concurrent calls are pipelined over a few
// confirm channels: each waits for its own confirm while others publish.
//
// When the connection or a channel is lost, the Publisher redials with
// exponential backoff and jitter. A Publish caught by the loss, or made during
// the outage, waits and publishes again once connected, until its context
// ends: give it a deadline. An error therefore means "not confirmed", never
// "not delivered": a message whose confirm was lost with the connection may
// have reached its queue, and publishing it again can make a duplicate.
// Consumers should be idempotent, as they must be with any at-least-once
// delivery.
//
// Each publish is an OpenTelemetry PRODUCER span "send <exchange>" whose
// context is written into a copy of the message's headers (traceparent), and
// is counted in messaging.client.sent.messages and
// messaging.client.operation.duration (until the confirm). While the tracer
// records nothing (no SDK set) and the context carries no span, no span is
// started, as in the listener; the context's baggage is still written.
//
// # Many messages in flight: PublishAsync
//
// A caller with many messages to publish (a relay, a recoverer) need not
// park a goroutine per message on its confirm: PublishAsync returns once the
// message is sent and calls a done func with what Publish would have
// returned, after the same re-sends. An error from PublishAsync itself means
// nothing was sent, and done is then never called; otherwise done is called
// exactly once, on the Publisher's completion goroutine, one call at a time:
// keep it quick and hand heavy work off. The confirm timeout runs per
// channel, from one timer that fails the oldest unconfirmed first; at most
// WithMaxInFlight async publishes await their outcome at once, and past that
// PublishAsync waits for room. Close calls every done still owed before it
// returns.
//
// # A message the broker would refuse
//
// RabbitMQ refuses some messages by closing the channel they came on, which
// loses the confirms of every other message in flight on it. Publish refuses
// what it can know the broker would refuse before sending anything, with
// ErrInvalidMessage: properties that do not fit a frame, an Expiration that
// is not 0 to 315360000000 milliseconds in decimal digits, a UserId other
// than the login (unless WithImpersonation). When the broker closes a
// channel anyway, a message its text names (a missing exchange, a user-id,
// an expiration, a size) fails; the others are published again. If the text
// names none, the messages lost with the channel are searched: published
// again in up to 8 groups at once, each on a channel of its own; a group
// whose channel stays open is confirmed, and one whose channel the broker
// closes again is split and searched the same way, until the message that
// caused it is the only one unconfirmed on a closed channel and fails with a
// *ChannelError. That takes a round per factor of 8 in flight (3 rounds for
// 500, 1 for up to 8), not a round trip per message. A message sent again in
// a group that the broker closes may have been stored unconfirmed before the
// close, like any message lost with its channel, so an innocent one may
// reach its queue once per round it was lost in, and once more.
//
// # Invalid options
//
// New checks the URL and every option before it dials, and one error names
// each problem with its value (errors.Join), rather than the first alone.
// A broker it cannot reach, or that refuses the login (ErrLoginRefused), fails New too, so that
// a misconfiguration shows at startup. Nothing in the package panics.
package publisher
