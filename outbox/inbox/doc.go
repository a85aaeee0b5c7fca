// Package inbox makes a RabbitMQ consumer process each message once: wrap
// your handler with Inbox.Handler, write its effects through the *sql.Tx it
// is given, and a redelivered message is acked without running it again.
//
// # What runs in which order
//
// For each delivery, Handler:
//
//  1. takes the key: the delivery's MessageId, or WithKey's function. No key
//     is middleware.Permanent(ErrNoMessageID): retrying cannot give a message
//     an id, so it goes to the recoverer or the queue's dead-letter exchange;
//  2. begins a transaction and inserts (consumer, key) into the inbox table
//     with ON CONFLICT DO NOTHING. No row inserted means the message was
//     processed already: it rolls back and returns nil, and the listener acks
//     (logged at debug). A concurrent delivery of the same message waits here
//     on the first one's uncommitted row, then skips if that one commits, or
//     processes if it rolls back;
//  3. calls your function with the transaction;
//  4. commits. The listener acks only after Handler returns nil, so after the
//     commit.
//
// Your function's error rolls everything back, the record included, and is
// returned for Retry and Recover to act on. A panic rolls back too and goes
// on up; the listener's CatchPanics makes it an error, which Retry retries.
// A commit that fails returns a *CommitError, an ordinary (retryable)
// error: if the commit did land after all, the redelivery finds the record
// and skips. So with Chain(Retry(n), Recover(r)) every message takes effect
// exactly once or reaches r, and with the outbox on the producer's side
// every committed business write takes effect exactly once downstream.
//
// The consumer is part of the key: by default the queue the listener
// consumes from (chainrun.Queue), or WithConsumerName. Two queues bound to
// one exchange each process the message once.
//
// # What the key must be
//
// The key identifies a message, not a business entity: the inbox cannot
// tell two different events that carry one id from a message and its
// redelivery, which is exactly what a redelivery looks like. A producer that
// sets MessageId to an order's id for "created" and then "paid" has "paid"
// acked and skipped, silently. Give each message an id of its own ("order-42
// paid"), or leave MessageId empty in the outbox, which then picks a random
// UUID per message; with WithKey, derive a key that is unique per event.
// This is documented rather than checked: no check on the consumer's side can
// tell a reused id from a redelivery.
//
// A key that PostgreSQL's text cannot hold (AMQP lets a message id carry a
// NUL byte or bytes that are not UTF-8) is recorded as "amqpretry-hex:" and
// its bytes in hex, as is a key that itself starts with that prefix: such a
// message is deduplicated like any other, rather than failing its insert on
// every delivery and being requeued for ever.
//
// # Retention
//
// The record is what makes a duplicate recognisable: Purge deletes records
// older than a duration, and a duplicate that arrives after its record was
// purged is processed again. Keep records longer than any redelivery takes
// (the outbox's whole retry schedule plus a person's Retry, a DLQ replay);
// days, not minutes.
//
// # Why the record and the effect commit together
//
// This is the idempotent consumer pattern
// (https://microservices.io/patterns/communication-style/idempotent-consumer.html),
// in a table of the consumer's own rather than a status on the producer's
// outbox row: the consumer's database need not be the producer's. A consumer
// that acks once the id is stored and then runs the business logic loses the
// effect if the process dies in between; here the effect and the id commit
// together, before the ack.
//
// Like the outbox, the inbox uses database/sql with PostgreSQL's SQL and
// imports no driver.
package inbox
