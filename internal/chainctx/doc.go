// Package chainctx is what the listener tells the middlewares of its chain
// through a delivery's context, and nothing a user calls: the queue, the
// shutdown signal that ends waits between attempts, the logger, the hook
// through which a delivery about to wait gives up its consumer's reader, the
// hook through which Recover says a delivery failed for good; and the survey that
// finds, as a chain is built, how long it may hold a delivery between attempts
// and which Recoverer a Permanent error of the handler reaches.
//
// The keys are distinct values of one unexported type. WaitHookKey is
// exported so that the listener's per-delivery context type can answer for
// it in its own Value method, saving an allocation per message.
package chainctx
