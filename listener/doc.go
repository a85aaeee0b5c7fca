// Package listener consumes a RabbitMQ queue reliably: New("orders", chain,
// handle, WithURL(url)) and Run(ctx) give you a pool of consumers that retries
// through your middleware chain, settles every message exactly as it should be,
// grows and shrinks with the load, redials after losses and shuts down without
// losing a message.
//
//	topo := dlx.Topology{Queue: "orders"} // orders, orders.dlx, orders.dlq
//	l, err := listener.New("orders",
//		middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey()))),
//		handle,
//		listener.WithURL(url), listener.WithDeclare(topo.Declare),
//		listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(10))
//	if err != nil {
//		return err // an invalid option, named with its value
//	}
//	return l.Run(ctx) // until ctx is done, then a graceful shutdown
//
// Several queues in one process run in a Group: one connection for all of
// them, started, made ready and stopped together. WaitReady blocks until a
// listener consumes; Stats has what a readiness probe needs.
//
// # What the listener does with a message
//
// Only the listener acks or rejects, one delivery at a time, on the channel
// the delivery came from, once the chain has returned:
//
//	nil                                   → ack
//	Permanent(err), no recoverer          → reject without requeue (the queue's own DLX, if any)
//	the recoverer put it elsewhere        → ack, after the broker confirmed the copy
//	the recoverer failed                  → reject with requeue: never lost
//	recoverer.Reject()                    → reject without requeue (the queue's own DLX)
//	any other error                       → reject with requeue
//	shutdown, a lost connection           → nack with requeue, never the DLQ
//
// A redelivered message that fails again without a recoverer waits a
// bounded delay first (WithRequeueDelay), so a poison message cannot spin
// the broker. If the channel a delivery came from has died, the broker has
// requeued it already, and it is never acked on another channel. Rejections
// are failures of the message and nacks are not: from RabbitMQ 4.3 a quorum
// queue counts only rejections toward its delivery limit.
//
// # Handlers at a time, channels and scaling
//
// WithConcurrentConsumers and WithMaxConcurrentConsumers are handlers at a
// time: a pool of handler slots (Spring's concurrent consumers, MassTransit's
// ConcurrentMessageLimit) that the listener's channels feed. A delivery
// holds a slot only while its handler runs: one waiting between retries
// holds none, and the healthy messages behind a poison one keep flowing.
// With more than one slot, handlers run side by side on each channel.
//
// The pool starts at the concurrent count. When a delivery finds every slot
// busy it grows by one at once, and the scaler, every 250ms
// (WithScaleInterval), grows it when every slot is busy and a passive
// declare shows messages ready in the queue; it shrinks to what was in use
// once no delivery has found it full for WithIdleTimeout (10s).
//
// Each channel has its own basic.qos prefetch (WithPrefetch; by default
// three per handler of the maximum, at least 20) and basic.consume: the
// broker's consumer list shows the channels, as many as the concurrent
// count, and at least two when the listener may scale. More open when every
// channel is full of deliveries waiting between retries while messages wait
// at the broker, and close after WithIdleTimeout with nothing in flight.
// Where the queue's order must hold (single active consumer, WithExclusive,
// WithPrefetch(1) with one handler) the listener consumes on one channel
// and runs one handler; on a queue it has not yet seen serve two of its
// channels at once, which a single-active-consumer queue never does, it runs
// one handler until it has. Decisions are logged at debug level and visible
// in Stats (Consumers: the slots now; Channels).
//
// # Consumer arguments
//
// Each basic.consume can carry what Spring AMQP and MassTransit set per
// consumer: WithConsumerPriority (x-priority: the broker feeds the
// highest-priority consumers of a queue that have room first),
// WithExclusive (the queue's only consumer: the broker refuses every other,
// and Run ends with a *ConsumeRefusedError that says which side is
// exclusive; one consumer only), and WithConsumerTagPrefix (tags that say
// whose a consumer is in rabbitmqctl list_consumers). Single active
// consumer, one consumer at a time with standbys that take over, is the
// queue's argument: dlx.Topology.SingleActiveConsumer. On such a queue
// more consumers in one listener add no throughput: a listener that
// declares the queue that way (WithDeclare(topo.Declare)) never scales up
// on it and, with more than one consumer, warns once; on a queue declared
// elsewhere it sees a consumer get nothing for a second while the others
// work and messages are ready, warns once, and adds no more consumers.
// Until a second consumer has had messages, it adds one consumer at a
// time. Run one consumer per listener on such a queue, and several
// processes.
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
// timeout. Collect such messages in a store of your own and return, or let
// NewBatch collect them.
//
// # Batches
//
// NewBatch hands a BatchHandler up to a batch size of deliveries at once,
// or what arrived within a wait after the first, for handlers that write to
// a database or an API in bulk (Spring AMQP's consumerBatchEnabled with
// batchSize and receiveTimeout, MassTransit's Batch<T>). Everything else is
// the same: options, scaling, shutdown, reconnection, kill switch and
// telemetry. The handler returns nil (all acked), PerMessage(errs) with one
// result per delivery, or an error or panic that fails the whole batch.
// Each failed message goes through the middleware alone: its chain's first
// call returns the error the batch gave it, and the later ones run the
// handler on a batch of that one message, so Retry(5) means five attempts
// in all and the Recover at the end gets what still fails; a batch-level
// failure retries every message alone, which singles out the one that broke
// it. Failures waiting between retries are parked as a single handler's
// are: the consumer goes on with the next batches. Prefetch must be at
// least the batch size. The batch gets one process span with a link to
// each message's producer.
//
// # Consumer timeout
//
// RabbitMQ closes a consumer's channel (4.3: cancels the consumer of a
// quorum queue) when a delivery stays unacknowledged past its
// consumer_timeout, 30 minutes by default, and every delivery on it goes
// back to the queue. New refuses a chain whose Retries' waits, plus the
// handler's middleware.Timeout on every attempt, may last that long
// (WithConsumerTimeout tells it the broker's setting). At run time the
// listener warns when the oldest delivery in flight reaches 80% of the
// timeout (Stats().OldestInFlight), and once per consumer when its prefetch
// times its mean handler time does. When the broker does time a consumer
// out, the listener logs an error naming the queue and the settings that
// decide the timeout and replaces the consumer; the deliveries come back.
// WithConsumerTimeoutArgument asks for a timeout per consumer, which only
// RabbitMQ 4.3 honours (on quorum queues; a classic queue refuses it and Run
// ends with an error naming it). What each RabbitMQ version does:
// docs/consumer-timeout.md in the repository.
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
// chain has no Recover. With the option each connection starts with one
// consumer at prefetch 1 while the returned messages come back, so that a
// crash counts only the message that causes it. Every return counts (a
// lost connection, a requeue after a failure, on RabbitMQ before 4.3 a nack
// at shutdown): choose n of 3 or more, below the queue's own
// x-delivery-limit (20 by default on RabbitMQ 4). Classic queues give no
// count, and there the limit does not act (the listener logs so once).
// More: docs/redelivery-limit.md.
//
// # Kill switch
//
// During a downstream outage every delivery fails, exhausts its retries and
// goes to the DLQ: the whole queue, to be replayed by hand. WithKillSwitch
// (MassTransit's kill switch) stops consuming instead: when, over the
// tracking period, at least ActivationThreshold deliveries ended and the
// share that failed for good reaches TripThreshold, the listener cancels its
// consumers, and what was in flight goes back to the queue with a nack,
// never to the DLQ because of the trip. After RestartTimeout (doubled at
// each trip in a row, up to MaxRestartTimeout) one consumer at prefetch 1
// probes; its first success brings the others back, a failure trips it
// again. Stats().KillSwitch shows the state; trips, probes and resumptions
// are logged. More: docs/kill-switch.md.
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
// it opens a fresh connection and channels, runs WithDeclare again and
// resumes; the backoff is reset only once a connection gets as far as
// consuming. A broker that is down at start-up is waited for (WithFailFast
// ends Run instead). A refused login, an untrusted certificate, a
// declaration the broker refuses, or a basic.consume it refuses (403, 405,
// 406) ends Run with the error: retrying cannot heal a refusal. A missing
// queue is retried with backoff (or ends Run with WithMissingQueueFatal). A
// consumer cancelled by the broker (queue deleted, consumer timeout) is
// replaced.
//
// # Telemetry
//
// Each delivery gets a CONSUMER span "process <queue>" with OpenTelemetry's
// messaging attributes, linked to the producer's span from the traceparent
// header (WithProducerAsParent makes it the parent); in batch mode each batch
// gets one, with messaging.batch.message_count and a link per message. The
// metrics are messaging.process.duration and
// messaging.client.consumed.messages, per message in either mode,
// amqpretry.consumers.active and amqpretry.deliveries.parked (with a kill
// switch, amqpretry.killswitch.trips and amqpretry.killswitch.state). The
// providers (WithTracerProvider, WithMeterProvider, WithPropagators,
// defaulting to the globals) reach the Retry and Recover of the chain, which
// add attempt spans and their own metrics. Process spans are roots, whatever
// span Run's context carries. With no SDK installed they are not even built
// (except with WithProducerAsParent); an SDK set later is picked up within a
// second.
//
// # Shutdown
//
// When Run's context is done, the listener cancels its consumers, interrupts
// deliveries waiting between retries (they are requeued at once), gives
// running handlers WithShutdownTimeout (10s) to finish, then cancels their
// context, requeues what is left, closes, and returns nil. No delivery
// interrupted this way reaches a recoverer, and one whose handler, cut off,
// returns a Permanent error is handed back too, not rejected to the queue's
// DLX: a shutdown never sends a message to the DLQ. Every goroutine Run
// started has ended when it returns.
//
// # Invalid options
//
// New checks every argument and option, and the chain's worst-case wait
// between attempts against WithConsumerTimeout, before it returns: one error
// names each problem with its value (errors.Join), rather than the first
// alone. Nothing is checked against the broker until Run. New does not
// panic; the middleware constructors it is given do, for mistakes in the
// code.
package listener
