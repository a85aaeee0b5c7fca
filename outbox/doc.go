// Package outbox publishes a message if and only if your database
// transaction commits: call Enqueue with the *sql.Tx of your business write,
// and run a Relay, which publishes the row to RabbitMQ and marks it sent once
// the broker has confirmed it.
//
// This is the transactional outbox of seed 003 ("RabbitMQ可靠消息落地方案"):
// the message row is written with the business row, so neither exists
// without the other; a sweeper re-sends what was not confirmed; after a
// limit a row waits for a person instead of being dropped.
//
// # What runs in which order
//
//  1. Once, at deploy: Migrate (or a DBA applies Schema) creates the table
//     and its partial indexes.
//  2. In your code: BEGIN; your writes; Enqueue(ctx, tx, exchange, key, msg);
//     COMMIT. A rolled-back transaction leaves no message.
//  3. In one or more processes: Relay(pub).Run(ctx). It runs WithWorkers
//     loops (2), each repeating a pass: in one transaction, claim up to
//     WithBatchSize (500) due rows in id order with
//     SELECT ... FOR UPDATE SKIP LOCKED, publish them through pub
//     (mandatory, confirms; pipelined, up to WithConcurrency at once, started
//     in id order), record each outcome and commit:
//     - confirmed: status sent, sent_at set;
//     - returned (no queue bound), nacked, not confirmed in
//     WithPublishTimeout, exchange missing: retried_count + 1, the error's
//     text in last_error, next_retry_at after an exponential backoff
//     (WithRetryBackoff); at WithMaxTries the row is failed. A message the
//     publisher refuses as invalid fails at once: resending cannot help;
//     - not attempted, or cut short by shutdown: untouched, due again.
//     A pass that found less than a batch waits WithPollInterval (50ms)
//     before the next; the workers start half an interval apart. Measured
//     on a 2-core machine: a commit reaches the consumer in 30ms at the
//     median, 50-60ms at worst.
//  4. A person fixes what made rows fail (declares the exchange, binds the
//     queue) and calls Retry(id) or RetryAllFailed; List shows the rows.
//  5. Each relay (one of its workers) deletes sent rows older than WithRetention (24h), in
//     batches, every WithCleanupInterval. Failed and in-flight rows are
//     never deleted.
//
// # Guarantees
//
// A row is marked sent only after the broker's confirm, in the transaction
// that claimed it. If that transaction is lost (the database goes away, the
// process dies) after the confirm, the row stays in flight and is sent
// again: delivery is at least once, never at most once. Every publish of a
// row carries the same MessageId — msg.MessageId if you set one, else a
// random UUID chosen by Enqueue and stored in message_id — so consumers
// deduplicate; the inbox package does that in the consumer's transaction.
// While a pass holds its rows locked no other relay can claim them, so two
// relays do not send the same row in the normal case. Order: rows are
// claimed and their publishes started in id (creation) order, but
// concurrent publishes over several channels may reach the queue slightly
// out of order, two workers' batches interleave, and a row that failed a
// try goes behind newer rows; WithWorkers(1) and WithConcurrency(1) give
// strict order of first sends, at a fraction of the throughput.
//
// A publish that is not confirmed counts as a try even when the broker,
// not the message, is at fault: rows pending through a broker outage longer
// than their schedule (about 13 minutes with the defaults: ten tries of up
// to WithPublishTimeout each, with backoff between) become failed. They are
// kept: RetryAllFailed sends them once the broker is back, or raise
// WithMaxTries.
//
// A database that fails is logged (with any password in the text hidden;
// see Redact), waited out with backoff, and resumed from: Run returns only
// when its context ends (nil) or the publisher was closed under it.
//
// # Statuses and the seed's table
//
//	seed status                              here
//	1 投递中 (being delivered)                in_flight  (new, or due again at next_retry_at)
//	2 投递成功 (delivered)                    sent       (confirmed; deleted after the retention)
//	3 投递失败等待人工补偿 (failed, awaiting    failed     (retried_count reached WithMaxTries;
//	  manual compensation)                               last_error says why; Retry sends it again)
//	4 消息已在consumer入库 (stored by the      the inbox package's table, on the consumer's side
//	  consumer)
//
// retried_count counts failed publishes; next_retry_at is when an in-flight
// row is due. The seed's message column is split into properties (every AMQP
// property and header, in an encoding of this package that keeps each
// header value's type) and body (bytea).
//
// # PostgreSQL through database/sql
//
// The statements are PostgreSQL's ($1 placeholders, FOR UPDATE SKIP LOCKED,
// partial indexes, identity columns, PostgreSQL 10 or later), sent through
// database/sql, so any PostgreSQL driver works: pgx's stdlib driver (the
// tested one), lib/pq. The package imports no driver: your program does.
//
// # Why a module of its own
//
// The outbox and the inbox live in the module
// github.com/amqpretry/amqpretry/outbox, not in the core module, so that
// what their tests need (pgx, a database) never enters the core's go.mod:
// importing middleware, listener or recoverer pulls no database code into a
// build, and the core's dependency list stays the one DESIGN.md allows.
// Require this module only where you publish or consume through a database.
package outbox
