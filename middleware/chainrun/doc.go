// Package chainrun is for code that runs a middleware chain or extends it
// without the listener: a consumer of your own that runs the chain and
// settles what it returns, a middleware of yours that waits, a Recoverer of
// yours that writes what the chain knows about a failure.
//
// The listener does all of this for you; a program that only uses
// listener.New does not need this package.
//
// # Running a chain on your own consumer
//
// Give the chain's context the queue name (WithQueue: recoverers write it
// into fault headers) and, for a graceful shutdown, a channel that ends the
// waits between retries (WithInterrupt); then settle each delivery with
// Settle, which acks, rejects or nacks it as SettlementFor says:
//
//	ctx := chainrun.WithInterrupt(chainrun.WithQueue(ctx, "orders"), stopping)
//	for d := range deliveries {
//		err := handle(ctx, &d) // handle := chain(yourHandler)
//		if _, err := chainrun.Settle(&d, err); err != nil {
//			return err // the channel is gone: the broker has requeued its deliveries
//		}
//	}
//
// # Middleware and recoverers of your own
//
// A middleware that waits (a rate limiter, a lock) calls WillWait first, so
// that the listener goes on reading deliveries meanwhile. A Recoverer reads
// the queue with Queue, the attempts made with AttemptsMade, and, for its
// own fault headers or telemetry, the handler's error without the library's
// wrappers (HandlerError) and a name for its cause (ErrorType), as
// recoverer.Republish does.
package chainrun
