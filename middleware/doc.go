// Package middleware composes RabbitMQ message handlers: wrap your Handler in
// Chain(Retry(5), Recover(r)) and a failing message is retried with backoff and,
// when every attempt has failed, handed to a Recoverer (a dead-letter exchange,
// a broker retry tier) instead of being requeued forever.
//
//	chain := middleware.Chain(
//		middleware.Retry(5), // 1s, 2s, 4s, 8s between the attempts
//		middleware.Recover(recoverer.Republish(pub, "orders.dlx", "orders")),
//	)
//	l, err := listener.New("orders", chain, handle, listener.WithURL(url))
//
// # What a handler returns
//
// A Handler returns nil (done), an error (retry it), or Permanent(err)
// (never retry it; backoff.Permanent is honoured too, through any %w
// wrapping). A panic becomes a *PanicError carrying its stack and is
// retried like any error. The listener settles the delivery from what the
// chain returns:
//
//	nil                                   → ack
//	Permanent, with no recoverer          → reject without requeue (the queue's own DLX)
//	ErrReject (from recoverer.Reject)     → reject without requeue (the queue's own DLX)
//	ErrRecoveryFailed (recoverer failed)  → requeue with a nack: the message is not safe elsewhere,
//	                                        and RabbitMQ 4.3 does not count it (recoverer.Requeue: a reject)
//	ErrInterrupted (shutdown, lost link)  → nack with requeue, never recovered
//	anything else (ErrRetriesExhausted …) → requeue
//
// # Order
//
// Chain(a, b, c)(h) is a(b(c(h))): the first middleware is the outermost and sees
// a delivery first. Retry calls every middleware after it on each attempt.
//
// Recover cooperates with an enclosing Retry. In the usual chain
//
//	Chain(Retry(5), Recover(dlq))
//
// Recover sits inside Retry and sees every attempt's error. It asks the Retry
// around it whether that error will be retried: if so it passes the error up and
// Retry waits and tries again; if not (the last attempt, a Permanent error, a
// retry predicate that says no, the time limit) Recover hands the delivery to the
// Recoverer. The mirrored chain Chain(Recover(dlq), Retry(5)) behaves the same:
// with no Retry around it, Recover recovers whatever Retry finally returns.
//
// # Retry
//
// Retry(n) makes at most n attempts, the first call included (Spring AMQP's
// maxAttempts). The default backoff waits 1s, doubling, capped at 10s, with
// no jitter and no time limit: Retry(5) waits 1s, 2s, 4s, 8s. Options change
// each of these, choose which errors are retried (RetryIf), report each
// retry (OnRetry) and hand long waits to a broker-side retry
// (HandOffAfter). Exhausted retries return an error that matches
// ErrRetriesExhausted and unwraps to the last attempt's error.
//
// Retry waits in a select on the context and a timer: the listener's
// shutdown ends a wait at once, and the delivery goes back to its queue. A
// delivery waiting between attempts holds no consumer: other deliveries,
// healthy ones behind a poison one included, go on meanwhile.
//
// # Per-error policies
//
// RetryOn and NoRetryOn give a class of errors (ErrorIs, ErrorAs,
// ErrorFunc) a schedule of its own; the first rule that matches the latest
// error decides, Retry's own schedule takes the rest:
//
//	timeouts := middleware.ErrorIs("timeout", ErrUpstreamTimeout)
//	invalid := middleware.ErrorAs[*ValidationError]("validation")
//	middleware.Retry(3,
//		middleware.RetryOn(timeouts, 5, middleware.WithInitialInterval(100*time.Millisecond)),
//		middleware.NoRetryOn(invalid))
//
// The same classes route the failures that are not retried to destinations
// of their own with recoverer.ByError. The rule that applied is reported by
// RuleApplied, on the attempt spans and in the dead letter's fault headers.
//
// # Timeout
//
// Timeout(d) gives the handler's context a deadline d later. A call that
// returns after it fails with a *TimeoutError (ErrTimeout), whatever it
// returned, so Retry retries it and Recover recovers it like any failure;
// a handler that ignored the deadline is reported with a warning when it
// finally returns. Put it innermost, Chain(Retry(3), Recover(r), Timeout(d)),
// so that it bounds each attempt. Placed around a Retry it bounds the whole
// delivery instead, and a wait it cuts short is a timeout, not a shutdown.
// listener.New counts d on every attempt toward the delivery's worst case,
// with the Retries' waits, against the broker's consumer_timeout.
//
// # State
//
// A Middleware built by Retry is immutable and safe to share; each delivery gets
// its own execution (attempt counter, backoff state), so Retry can serve many
// deliveries concurrently. listener.New works out how long a chain's Retries
// may hold one delivery in backoff and refuses one that could outlast
// RabbitMQ's consumer_timeout (30 minutes by default): waits longer than that
// belong in broker-side retry tiers (package dlx), not in memory.
//
// # Middleware and recoverers of your own
//
// A Middleware is a func(Handler) Handler; a Recoverer has one method, and
// RecovererFunc adapts a function. A middleware of yours that waits (a rate
// limiter, a lock) should call chainrun.WillWait first, so that the listener
// keeps reading deliveries while it waits. A recoverer of yours reads the
// queue with chainrun.Queue(ctx) and the attempts made with
// chainrun.AttemptsMade(cause). To run a chain on an amqp091 consumer of
// your own instead of the listener, package middleware/chainrun has what the
// listener does: WithQueue, WithInterrupt, and Settle for each delivery.
//
// # Invalid arguments
//
// Retry, Recover and Chain panic on arguments that are wrong whatever the
// broker says (Retry(0), an invalid option, a nil Recoverer or middleware):
// the mistake shows at startup rather than at the first message. Retry checks
// every option before it panics, and its message names each invalid one with
// its value.
package middleware
