// Package outbox publishes a message if and only if your database
// transaction commits: call Enqueue with the *sql.Tx of your business write,
// and run a Relay, which publishes the row to RabbitMQ and marks it sent once
// the broker has confirmed it.
//
// This is the transactional outbox pattern
// (https://microservices.io/patterns/data/transactional-outbox.html): the
// message row is written with the business row, so neither exists without
// the other; the relay sends again what the broker did not confirm; after a
// limit a row waits for a person instead of being dropped. The inbox package
// is its consumer side.
//
// # What you do
//
//  1. Once, at deploy: Migrate (or a DBA applies Schema, also printed by
//     `amqpretry outbox schema`) creates the table and its partial indexes.
//  2. In your code: BEGIN; your writes; Enqueue(ctx, tx, exchange, key, msg);
//     COMMIT. A rolled-back transaction leaves no message.
//  3. In one or more processes: Relay(pub).Run(ctx). Each relay claims due
//     rows in id order under a lease, publishes them through pub (mandatory,
//     with confirms) with no transaction open, and records each outcome as
//     it arrives, claiming more while slow confirms are awaited.
//  4. When rows fail (no queue bound, an exchange missing), a person fixes
//     the cause and calls Retry(id) or RetryAllFailed (`amqpretry outbox
//     retry ID` or `--all-failed`); List and Counts show the rows.
//
// A row's outcome:
//
//   - confirmed: StatusSent, sent_at set; deleted after WithRetention (24h),
//     by a relay, in batches, every WithCleanupInterval;
//   - returned (no queue bound), nacked, not confirmed within
//     WithPublishTimeout, exchange missing: another try after an exponential
//     backoff (WithRetryBackoff: 1s doubling up to 5 min), and StatusFailed
//     at WithMaxTries (10), with the reason in last_error;
//   - refused as invalid by the publisher (publisher.ErrInvalidMessage: a
//     UserId other than its login, say), or closing a channel even when sent
//     alone (*publisher.ChannelError): StatusFailed at once, since resending
//     cannot help;
//   - the publisher has no connection (publisher.ErrNotConnected: the broker
//     is down): handed back with no try counted, and the relay waits with
//     backoff;
//   - not attempted, or cut short by shutdown: handed back, due at once.
//
// Failed and in-flight rows are never deleted.
//
// # Guarantees
//
// A message exists if and only if its transaction committed. A row is
// marked sent only after the broker's confirm, by the claim that published
// it. No transaction is open while a relay waits on the broker, so a slow
// broker cannot run into PostgreSQL's idle_in_transaction_session_timeout,
// and a relay that dies, freezes or loses its database connection holds no
// lock: its rows are taken by another relay once its lease (WithLease, by
// default the publish timeout plus 30s) lapses. That is also the cost: such
// rows wait up to the lease, where a lock would have been released as soon
// as the database saw the connection close. A lease that lapses while its
// relay is still at work (longer than the lease to record, a database
// outage) makes the row sent twice; whatever the first relay learns after
// that is not written, since every statement names its claim's token. If
// the marks are lost (the database goes away after the confirm and stays
// away until the lease ends, the process dies), the row is sent again:
// delivery is at least once, never at most once.
//
// Every publish of a row carries the same MessageId — msg.MessageId if you
// set one, else a random UUID chosen by Enqueue and stored in message_id —
// so consumers deduplicate; the inbox package does that in the consumer's
// transaction. The MessageId identifies the message, not a business entity:
// two events about one order need two ids, or a consumer's inbox skips the
// second as a redelivery of the first.
//
// Order: rows are claimed and their publishes started in id (creation)
// order, but concurrent publishes over several channels may reach the queue
// slightly out of order, two workers' batches interleave, and a row that
// failed a try goes behind newer rows; WithWorkers(1) and WithConcurrency(1)
// give strict order of first sends, at a fraction of the throughput.
//
// Shutdown: once Run's context ends it claims and starts nothing more, waits
// up to WithShutdownTimeout (5s) for the confirms of what it has sent,
// records them and hands the rest back (up to 5s more to write that), so a
// restart re-sends only what was not confirmed in that time.
//
// A broker outage uses up no tries, however long it lasts, and the relay
// resumes when the broker is back. A publish sent but not confirmed in time
// (the connection died after the send, a broker too slow to confirm) does
// count, since the relay cannot tell it from a message the broker will not
// take: ten such tries (with the defaults, about 13 minutes of backoff) fail
// the row, which is kept for RetryAllFailed.
//
// A database that fails is logged (with any password in the text hidden;
// see Redact), waited out with backoff, and resumed from: Run returns only
// when its context ends (nil) or the publisher was closed under it.
//
// # The table
//
//	id             identity: the order of creation
//	message_id     the MessageId every publish of the row carries
//	exchange, routing_key
//	properties     every AMQP property and header, each header's type kept
//	body           bytea
//	status         in_flight (new, or due again at next_retry_at),
//	               sent (confirmed), failed (waiting for a person)
//	retried_count  failed publishes of the row
//	next_retry_at  when an in-flight row is due (after a failed try, its
//	               backoff)
//	created_at     when Enqueue wrote it
//	sent_at        when the broker confirmed it
//	last_error     why the last try failed
//	claim          the token of the relay's claim that holds the row (NULL
//	               when none does)
//	leased_until   when that claim's lease ends
//
// # PostgreSQL through database/sql
//
// The statements are PostgreSQL's ($1 placeholders, FOR UPDATE SKIP LOCKED,
// partial indexes, identity columns, PostgreSQL 10 or later), sent through
// database/sql, so any PostgreSQL driver works: pgx's stdlib driver (the
// tested one), lib/pq. The package imports no driver: your program does.
//
// The outbox and the inbox live in the module
// github.com/amqpretry/amqpretry/outbox, not in the core module, so that
// importing middleware, listener or recoverer never pulls database code or
// a driver into a build. Require this module only where you publish or
// consume through a database.
//
// How the relay works inside, what it was measured at, and how to upgrade
// a table created before leases: docs/outbox-inbox.md in the repository
// (https://github.com/amqpretry/amqpretry/blob/main/docs/outbox-inbox.md).
package outbox
