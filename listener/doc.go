// Package listener consumes a RabbitMQ queue reliably: New("orders", chain,
// handle, WithURL(url)) and Run(ctx) give you a pool of consumers that retries
// through your middleware chain, settles every message exactly as it should be,
// grows and shrinks with the load, redials after losses and shuts down without
// losing a message.
//
//	l, err := listener.New("orders",
//		middleware.Chain(middleware.Retry(5), middleware.Recover(dlq)), handle,
//		listener.WithURL(url), listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(10))
//	err = l.Run(ctx) // blocks until ctx is done
//
// # Consumers
//
// Each consumer is one AMQP channel with its own basic.qos prefetch and
// basic.consume, so the broker's consumer count is the listener's size. A
// consumer runs one handler at a time: every delivery goes through mw(gate(h)),
// and the gate, held while the handler runs, sits inside the chain. A delivery
// runs on the goroutine that read it; when it is about to wait between
// retries (middleware.WillWait), it is parked and a new goroutine takes over
// the reading. So a healthy message costs no goroutine of its own, a delivery
// waiting between retries holds no worker, and the healthy messages behind a
// poison one keep flowing.
//
// # What a handler must not do
//
// A handler must not settle its own delivery (d.Ack, d.Nack, d.Reject): the
// listener settles every delivery once the chain returns, and a second ack of
// the same delivery tag is a protocol error with which the broker closes the
// channel, requeueing every other delivery on it. Return nil, an error, or a
// Permanent error instead.
//
// A handler must not wait for another message of the same queue to arrive
// (a reply, the next part of a batch): one handler runs at a time per
// consumer, so the message it waits for is either queued behind it on the
// same consumer or prefetched by another, and it can wait until the consumer
// timeout. Collect such messages in a store of your own and return.
//
// # Consumer timeout
//
// RabbitMQ closes a consumer's channel when a delivery stays unacknowledged
// past its consumer_timeout (30 minutes by default), and every delivery on
// that channel goes back to the queue. New refuses a chain whose Retries'
// waits, plus the handler's middleware.Timeout on every attempt, may last
// that long (WithConsumerTimeout tells it the broker's setting); it finds
// them by building the chain, never by running it. When the broker does
// close a channel for it (406 "delivery acknowledgement on channel N timed
// out"), the listener logs an error naming the queue and the settings that
// decide the timeout, and replaces the consumer; the deliveries come back.
// RabbitMQ 4.3 times out quorum queues only, and cancels the consumer
// instead of closing its channel, taking its deliveries back uncounted: the
// listener logs that, cancels the handlers of those deliveries, neither
// handles nor settles the rest of them (another consumer gets them) and
// replaces the consumer. WithConsumerTimeoutArgument asks for a timeout per
// consumer, which 4.3 honours on quorum queues and refuses on classic ones
// (Run ends with an error naming it), and 3.10.8 and 4.0.5 accept and
// ignore; on 4.0 the queue's x-consumer-timeout argument works, checked on
// the channel's tick (once a minute by default). What New cannot
// know without a Timeout, the handler's time on each attempt and a delivery's turns
// behind the rest of the prefetch, the listener watches at run time: it logs
// a warning, once per delivery, when the oldest delivery in flight reaches
// 80% of the timeout, and Stats().OldestInFlight shows that age. It counts
// from when the listener read the delivery; a delivery prefetched behind a
// busy handler waited in the client before that, so with slow handlers keep
// WithPrefetch × handler time well under the timeout: the listener warns,
// once per consumer, when its prefetch times its mean handler time reaches
// that 80%.
//
// # Redelivery limit
//
// A message that kills the process handling it (out of memory, a crash in
// cgo, os.Exit in a library, a SIGKILL for a stuck handler) never returns an
// error: the broker requeues it when the connection drops and hands it to
// the next instance, which dies too. WithRedeliveryLimit(n) reads the
// x-delivery-count a quorum queue adds on each redelivery; a delivery
// counted n times before goes to the recoverer of the chain's innermost
// Recover with a *RedeliveryLimitError (ErrRedeliveryLimit) before any
// middleware or the handler runs, or is rejected without requeue when the
// chain has no Recover. The process span gets an EventRedeliveryLimit event;
// recoverer.Republish writes the error into the fault headers.
//
// A crash returns every delivery in flight, and the broker counts one for
// each: at full prefetch, the messages beside the one that kills the process
// would reach the limit with it. So with the option each connection starts
// carefully: one consumer at prefetch 1 while the returned messages come back
// (the broker delivers them first), so that a crash counts only the message
// that causes it; the first message never delivered before, once the
// consumer has run a second, or a second without a handler running, ends
// it. Two broker facts bound what n means (RabbitMQ 3.10.8 and 4.0.5):
// every return counts (a lost connection, a requeue after a failure, a nack
// at shutdown); and a connection that dies with several quorum consumers may
// count the deliveries of one of them twice. Choose n of 3 or more, and
// below the queue's own x-delivery-limit (20 by default on RabbitMQ 4).
// Classic queues give no count, only the redelivered flag, which one lost
// connection sets: the limit does not act on them, and the listener logs so
// once.
//
// # Kill switch
//
// During a downstream outage every delivery fails, exhausts its retries and
// goes to the DLQ: the whole queue, to be replayed by hand. WithKillSwitch
// (MassTransit's kill switch) stops consuming instead: when, over the
// tracking period, at least ActivationThreshold deliveries ended and the share
// that failed for good reaches TripThreshold, the listener cancels its
// consumers and ends their deliveries' waits, so what was in flight goes back
// to the queue with a nack and nothing reaches the recoverer because of the
// trip. A failure is counted as it is about to go to the recoverer (Recover
// asks the listener first), so the one that trips the switch goes back too. After RestartTimeout (doubled at each trip in a row, up to
// MaxRestartTimeout) one consumer at prefetch 1 probes; its first success
// brings the others back, a failure trips it again. Stats().KillSwitch
// shows the state; trips, probes and resumptions are logged.
//
// The breaker's state machine is ours, about a hundred lines. sony/gobreaker
// v2.4.0 was the candidate: go 1.22, no dependency outside its tests, a
// rolling window (BucketPeriod), ReadyToTrip over its counts for the trip
// threshold and minimum activity, and a two-step API for outcomes reported
// after the fact. failsafe-go v0.9.8's circuit breaker needs go 1.22 too but
// brings gRPC and protobuf into the module graph. We use neither: the
// library's dependencies are a closed list (amqp091-go, backoff/v4,
// OpenTelemetry), gobreaker's open state has one fixed Timeout where the
// kill switch backs off, and what matters here, stopping consumers and
// keeping in-flight deliveries from the recoverer, is the listener's either
// way.
//
// # Scaling
//
// Between WithConcurrentConsumers and WithMaxConcurrentConsumers, the listener
// looks at its consumers every 250ms (WithScaleInterval). When they are busy
// (75% of the time in their handler, or every prefetch slot taken) and a
// passive declare shows messages ready in the queue, it adds as many consumers
// as would drain the backlog within two seconds at the measured rate, several
// at once. A consumer above the minimum with nothing in flight and no work for
// WithIdleTimeout (10s) is stopped. Decisions are logged at debug level and
// visible in Stats.
//
// # Settlement
//
// Only the listener acks or rejects, one delivery at a time as
// middleware.Settle does (acks may go together: see Ack coalescing): nil
// acks; Permanent rejects without requeue; other
// errors requeue; a redelivered message that fails again waits a bounded
// delay (WithRequeueDelay) first, so a poison message without a recoverer
// cannot spin the broker. A delivery is always settled on the channel it came
// from: if that channel has died, the broker has already requeued it, and it
// is never acked on another.
//
// # Ack coalescing
//
// Each ack is a frame, and a write, of its own. WithAckCoalescing(n, d)
// (Spring AMQP's batchSize on the simple container) lets the acks of up to n
// handled deliveries per consumer wait, none longer than d, and writes them
// as one basic.ack with multiple=true: RabbitMQ and the client spend less per
// message. A multiple ack settles every unsettled delivery of the channel up
// to its tag, so it only ever covers a run that starts at the channel's
// oldest unsettled delivery and holds nothing but handled ones: a delivery
// still in flight (parked between retries) ends the run, and the handled
// deliveries after it are acked one by one when the bound comes. A failure is
// rejected or nacked at once, alone, after the run below it. The price is
// paid on a crash or a lost connection: the broker redelivers the handled
// messages whose acks were waiting, at most n per consumer, and they are
// handled again (the at-least-once a handler must bear anyway, more often).
// A graceful shutdown, a scale-down and a kill-switch trip write the
// waiting acks before the channel closes; a consumer at prefetch 1 acks each
// delivery at once.
//
// # Connection
//
// The listener dials and redials by itself, with exponential backoff and
// jitter. Given the nodes of a cluster (WithURLs), each dial tries them in a
// random order and logs the node it reached; after losing a connection that
// was up, it dials the other nodes at once, the lost one last. After a loss
// it opens a fresh connection and channels, runs
// WithDeclare again and resumes; the backoff is reset only once a connection
// gets as far as consuming. A refused login, a declaration the broker
// refuses, or a basic.consume it refuses (403, 405, 406) ends Run with the
// error: retrying cannot heal a refusal. A missing queue is retried with backoff
// (or ends Run with WithMissingQueueFatal). A consumer cancelled by the broker
// (queue deleted) or whose channel was closed (consumer_timeout) is replaced.
//
// # Telemetry
//
// Each delivery gets a CONSUMER span "process <queue>" with OpenTelemetry's
// messaging attributes, linked to the producer's span from the traceparent
// header (WithProducerAsParent makes it the parent), and the metrics
// messaging.process.duration, messaging.client.consumed.messages,
// amqpretry.consumers.active and amqpretry.deliveries.parked (with a kill
// switch, amqpretry.killswitch.trips and amqpretry.killswitch.state). The providers
// (WithTracerProvider, WithMeterProvider, WithPropagators, defaulting to the
// globals) reach the Retry and Recover of the chain, which add attempt spans
// and their own metrics. Process spans are roots, whatever span Run's
// context carries. With no SDK installed they are not even built (except
// with WithProducerAsParent); an SDK set later is picked up within a second.
//
// # Shutdown
//
// When Run's context is done, the listener cancels its consumers, interrupts
// deliveries waiting between retries (they are requeued at once), gives
// running handlers WithShutdownTimeout to finish, then cancels their context,
// requeues what is left, closes, and returns nil. No delivery interrupted this
// way reaches a recoverer, and one whose handler, cut off, returns a
// Permanent error is handed back too, not rejected to the queue's DLX: a
// shutdown never sends a message to the DLQ.
//
// # Invalid options
//
// New checks every argument and option, and the chain's worst-case wait
// between attempts against WithConsumerTimeout, before it returns: one error names each
// problem with its value (errors.Join), rather than the first alone. Nothing
// is checked against the broker until Run. New does not panic; the
// middleware constructors it is given do, for mistakes in the code.
package listener
