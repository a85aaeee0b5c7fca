// Package middleware composes RabbitMQ message handlers: wrap your Handler in
// Chain(Retry(5), Recover(r)) and a failing message is retried with backoff and,
// when every attempt has failed, handed to a Recoverer (a dead-letter exchange,
// a broker retry tier) instead of being requeued forever.
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
// # Outcomes
//
// A handler returns nil (done), an error (retry it), or Permanent(err) (never
// retry it; backoff.Permanent is honoured too). Settle and SettlementFor state
// what the listener does with the chain's final error:
//
//	nil                                   → ack
//	ErrInterrupted (shutdown, lost link)  → release: nack with requeue, never recovered
//	ErrReject (from recoverer.Reject)     → reject without requeue (the queue's own DLX)
//	ErrRecoveryFailed (recoverer failed)  → requeue: the message is not safe elsewhere
//	Permanent                             → reject without requeue (the queue's own DLX)
//	anything else (ErrRetriesExhausted …) → requeue
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
// # Waiting without holding a worker
//
// Retry waits between attempts in a select on the context and a timer, and
// the listener's shutdown ends a wait at once. Because Retry calls next once
// per attempt, a concurrency gate placed around the innermost handler only, as
// the listener does with mw(gate(h)), is held while the handler runs and
// released while the delivery sleeps: other deliveries use the worker in the
// meantime, and a poison message in backoff does not block healthy ones. Put
// nothing that must hold a worker between Retry and the handler.
//
// Retry and Recover also call WillWait(ctx) before they wait (a backoff, a
// recoverer's publish). The listener runs deliveries on the goroutine that
// reads them and, when one is about to wait, hands the reading to a new
// goroutine, so a healthy message costs no goroutine and a waiting one never
// stalls its consumer. Call WillWait in your own middlewares before they wait.
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
// # Your own consumer
//
// The listener runs the chain and settles what it returns. A program that
// runs a chain on an amqp091 consumer of its own gives it the queue name with
// WithQueue (recoverers write it into fault headers) and settles each
// delivery with Settle, or reads SettlementFor.
//
// # Invalid arguments
//
// Retry, Recover and Chain panic on arguments that are wrong whatever the
// broker says (Retry(0), an invalid option, a nil Recoverer or middleware):
// the mistake shows at startup rather than at the first message. Retry checks
// every option before it panics, and its message names each invalid one with
// its value.
package middleware
