// Package console serves `amqpretry console`: a web page over one or more
// dead-letter queues that groups their dead letters by cause, charts each
// group's failures over time (Span, drawn as inline SVG), searches them
// (Search), shows each in full, and replays them (one edited, if need be:
// EditAndReplay), deletes them to the queue's archive (QUEUE.archive, from
// which the archive's pages restore them) or purges a queue for good,
// through dlx.Replay. The overview says what arrived since its snapshot and
// reloads itself when asked (a meta refresh).
//
// Looking never harms: a look takes a bounded snapshot with a consumer
// (prefetch bounded by the limit) and hands every message back with one
// basic.nack(multiple, requeue) at once, within the one request that asked
// for it (package deadletter, shared with the CLI's dlq
// commands); one look or action runs per queue at a time. Actions name
// messages by Key (message id, else a fingerprint), so they act on the
// messages shown even if the queue moved on, and go through dlx.Replay's
// confirm-before-ack: a replay or delete cut off halfway leaves the rest
// where it was.
//
// The server is safe by default: every page needs a session, which a token
// buys (an HttpOnly, SameSite=Strict cookie); the Host header must be one the
// console listens as (DNS rebinding); every change is a POST carrying the
// session's CSRF token from the console's own origin; ReadOnly hides and
// refuses every change; every response carries a Content-Security-Policy
// without inline script or style, nosniff, frame-ancestors 'none' and no
// referrer; text from messages is escaped as the CLI escapes it (package
// escape) before html/template escapes it again; every action is one JSON
// line in the audit log; no broker password reaches a page, the log or the
// audit.
package console
