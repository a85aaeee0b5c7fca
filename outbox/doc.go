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
//     loops (2), each repeating a pass: claim up to WithBatchSize (500) due
//     rows in id order under a lease, in one statement (so one short
//     transaction: SELECT ... FOR UPDATE SKIP LOCKED inside an UPDATE that
//     stamps the rows with the pass's token and sets next_retry_at to the
//     lease's end); publish them through pub with no transaction open
//     (mandatory, confirms; pipelined, up to WithConcurrency at once, started
//     in id order); then record each outcome in a statement of its own that
//     names the token:
//     - confirmed: status sent, sent_at set;
//     - returned (no queue bound), nacked, not confirmed in
//     WithPublishTimeout, exchange missing: retried_count + 1, the error's
//     text in last_error, next_retry_at after an exponential backoff
//     (WithRetryBackoff); at WithMaxTries the row is failed. A message the
//     publisher refuses as invalid (publisher.ErrInvalidMessage: a UserId
//     other than its login, say), or one the broker closed a channel on even
//     when it was sent alone (*publisher.ChannelError), fails at once:
//     resending cannot help;
//     - publisher without a connection (publisher.ErrNotConnected: the
//     broker is down or unreachable): handed back, no try counted, and the
//     worker waits with backoff, as for a database outage;
//     - not attempted, or cut short by shutdown: handed back, due at once.
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
// A row is marked sent only after the broker's confirm, by the claim that
// published it. No transaction is open while a relay waits on the broker,
// so a slow broker cannot run into PostgreSQL's
// idle_in_transaction_session_timeout, and a relay that dies, freezes or
// loses its database connection holds no lock: its rows are taken by
// another relay once its lease (WithLease, by default the publish timeout
// plus 30s) lapses. That is also the cost: such rows wait up to the lease,
// where a lock would have been released as soon as the database saw the
// connection close. A lease that lapses while its relay is still at work
// (longer than the lease to record, a database outage) makes the row sent
// twice; whatever the first relay learns after that is not written, since
// every statement names its claim's token. If the marks are lost (the
// database goes away after the confirm and stays away until the lease ends,
// the process dies), the row is sent again: delivery is at least once,
// never at most once. Every publish of a
// row carries the same MessageId — msg.MessageId if you set one, else a
// random UUID chosen by Enqueue and stored in message_id — so consumers
// deduplicate; the inbox package does that in the consumer's transaction.
// The MessageId identifies the message, not a business entity: two events
// about one order need two ids, or a consumer's inbox skips the second as a
// redelivery of the first. While a lease lasts no other relay claims its
// rows, so two relays do not send the same row in the normal case. Order: rows are
// claimed and their publishes started in id (creation) order, but
// concurrent publishes over several channels may reach the queue slightly
// out of order, two workers' batches interleave, and a row that failed a
// try goes behind newer rows; WithWorkers(1) and WithConcurrency(1) give
// strict order of first sends, at a fraction of the throughput.
//
// Shutdown: once Run's context ends it claims and starts nothing more,
// waits up to WithShutdownTimeout (5s) for the confirms of what it has sent,
// records them and hands the rest back, so a restart re-sends only what was
// not confirmed in that time.
//
// A broker outage uses up no tries: a publish that found the publisher
// without a connection leaves its row as it was, however long the outage,
// and the relay resumes when the broker is back. A publish sent but not
// confirmed in time (the connection died after the send, a broker too slow
// to confirm) does count, since the relay cannot tell it from a message the
// broker will not take: ten such tries (with the defaults, about 13 minutes
// of backoff) fail the row, which is kept for RetryAllFailed.
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
// row is due, or, while a relay holds it, when its lease ends; claim is the
// token of the relay's claim that holds it (NULL when none does).
//
// # Upgrading a table
//
// Tables created before leases lack the claim column: Migrate adds it
// (nullable, no default: a catalog change, whatever the table's size) and
// sets the table's fillfactor to 50 unless one is set (the pages written
// from then on leave room for the claim's heap-only update), and Schema
// shows the statements for a DBA. Relays of this version need it;
// relays of the earlier version still running meanwhile work on alongside,
// since they never read it: they skip rows under a lease (not yet due) and
// the new relays skip rows the old ones hold locked, so a row is still sent
// at least once. The seed's message column is split into properties (every AMQP
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
