// Package recoverer decides where a message goes when its handler has failed
// for good: Republish(pub, "orders.dlx", "orders") copies it to a dead-letter
// exchange with headers saying why, waits for the broker's confirm, and only
// then lets the listener ack the original.
//
// Use a recoverer with middleware.Recover:
//
//	middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer.Republish(pub, "orders.dlx", "orders")))
//
// A routing key of "" keeps the delivery's own, or, after retry hops that
// ended in the work queue through the default exchange, the one the message
// was first published with: right for a fanout DLX, or one bound with the
// keys producers use;
// a dlx.Topology's DLX is bound with the queue's name (DLQRoutingKey).
//
// A recoverer that returns nil promises the message is safe elsewhere; one
// that returns an error leaves it on its queue (the listener requeues it), so
// an unroutable, nacked or timed-out republish never loses the original.
// Reject hands the message to the queue's own dead-letter exchange instead,
// Requeue keeps it on its queue, and Fallback tries several in order:
//
//	recoverer.Fallback(recoverer.Republish(pub, "orders.dlx", "orders"), recoverer.Reject())
//
// ByError picks one by the error, with the classes of middleware.RetryOn:
//
//	recoverer.ByError(recoverer.Republish(pub, "orders.dlx", "orders"),
//		recoverer.When(fraud, recoverer.Republish(pub, "", "orders.fraud")),
//		recoverer.When(invalid, recoverer.Reject()))
//
// # Fault headers
//
// The republished copy keeps the body, every property (with persistent
// delivery forced) and the application headers, minus the broker's own
// (x-death, x-first-death-*, x-last-death-*, x-delivery-count) and CC and BCC,
// which the broker would route the copy to again. It gains
// Spring AMQP's headers, so Spring-side DLQ tools read it:
//
//	x-exception-message     the handler's error message
//	x-exception-stacktrace  a panic's stack, or else the chain of wrapped errors
//	x-original-exchange     the exchange the message was first published to
//	x-original-routingKey   its routing key (both kept across retry hops)
//
// and, under DefaultHeaderPrefix (x-amqpretry-, WithHeaderPrefix changes it):
//
//	original-queue       the queue it was consumed from
//	error-type           the Go type of the handler's error ("panic" for a panic)
//	attempts             how many attempts were made (int64)
//	retry-rule           the middleware.RetryOn rule that applied ("default" for
//	                     Retry's own schedule), when the chain's Retry has rules
//	failed-at            when it failed, RFC 3339 in UTC
//	host                 the host that gave up on it
//	original-expiration  its per-message TTL, removed so it does not expire on the DLQ
//	original-user-id     its user-id, removed when the publisher logs in as someone
//	                     else, since RabbitMQ refuses a user-id that is not the sender's
//	original-cc          its CC header, removed from the copy
//	dropped-headers      its own headers left out: too large for the frame, or
//	                     impossible to publish (nested too deep, of a type AMQP lacks)
//
// The stack trace and error messages can hold data from the message or the
// process; turn the stack trace off with WithStackTrace(false) if the DLQ is
// read by people who should not see it.
//
// All headers must fit in one AMQP frame. Republish keeps them within the
// negotiated frame_max minus a headroom (20,000 bytes, as Spring does,
// WithHeadroom changes it) by cutting the stack trace first (down to half the
// room; a panic's value is shortened inside it so that its frames stay), then
// the message, on UTF-8 boundaries, ending each cut with a marker that says how
// much was cut. The frame_max is the republisher's own connection's: a DLQ
// consumer that negotiates a smaller one needs a larger headroom.
// A headroom that leaves too little of the broker's frame_max is an error of
// Recover, so the message is requeued, not a panic: frame_max is the broker's.
//
// # Publishers and invalid arguments
//
// Republish takes a Publisher, the three methods it needs (Publish,
// FrameMax, Username): *publisher.Publisher is one, and a fake makes header
// building testable without a broker.
//
// Invalid options that cannot depend on the broker panic at construction,
// naming every bad option; what depends on the broker is an error at run
// time. So a nil publisher, a negative headroom or an over-long exchange name
// panics in Republish with all of the problems and their values at once,
// while a headroom that leaves too little of the broker's frame_max fails
// Recover.
package recoverer
