package chainctx

import (
	"context"
	"log/slog"
)

type key int

const (
	queueKey key = iota
	interruptKey
	waitHookKey
	loggerKey
	recoveryHookKey
	retryHopKey
)

// WithQueue records the queue a delivery came from; amqp.Delivery does not
// carry it.
func WithQueue(ctx context.Context, queue string) context.Context {
	return context.WithValue(ctx, queueKey, queue)
}

// Queue returns the queue recorded by WithQueue, or "".
func Queue(ctx context.Context) string {
	q, _ := ctx.Value(queueKey).(string)
	return q
}

// WithInterrupt returns a context under which Retry stops waiting as soon as
// interrupt is closed, while handlers that are running keep ctx and may
// finish: the listener's graceful shutdown.
func WithInterrupt(ctx context.Context, interrupt <-chan struct{}) context.Context {
	return context.WithValue(ctx, interruptKey, interrupt)
}

// Interrupt returns the channel given to WithInterrupt, or nil, which never
// fires in a select.
func Interrupt(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(interruptKey).(<-chan struct{})
	return ch
}

// WaitHook is told that a delivery is about to wait for something other than
// its consumer's worker (a backoff, a recoverer's publish). The listener
// implements it: the reading of deliveries goes on on a new goroutine.
type WaitHook interface{ WillWait() }

// WaitHookKey is the key WillWait looks the WaitHook up under, for a context
// type that answers for it in its Value method.
const WaitHookKey = waitHookKey

// WithWaitHook returns a context whose deliveries report waits to h.
func WithWaitHook(ctx context.Context, h WaitHook) context.Context {
	return context.WithValue(ctx, waitHookKey, h)
}

// WillWait tells the WaitHook in ctx, if any, that the delivery is about to
// wait.
func WillWait(ctx context.Context) {
	if h, ok := ctx.Value(waitHookKey).(WaitHook); ok {
		h.WillWait()
	}
}

// WithLogger records the listener's logger, for middlewares that report
// what a handler did (middleware.Timeout).
func WithLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey, l)
}

// Logger returns the logger given to WithLogger, or slog.Default().
func Logger(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey).(*slog.Logger); ok && l != nil {
		return l
	}
	return slog.Default()
}

// RecoveryHook is told that a delivery failed for good and is about to go
// to its recoverer, with the cause: the listener's kill switch counts it as a
// failure, though a recovered delivery is acked. A non-nil error stops the
// recovery (the switch has tripped): the delivery goes back to its queue.
type RecoveryHook interface{ Recovering(cause error) error }

// RecoveryHookKey is the key Recovering looks the RecoveryHook up under, for
// a context type that answers for it in its own Value method.
const RecoveryHookKey = recoveryHookKey

// Recovering asks the RecoveryHook in ctx, if any, whether the delivery may
// go to its recoverer because of cause: nil when it may.
func Recovering(ctx context.Context, cause error) error {
	if h, ok := ctx.Value(recoveryHookKey).(RecoveryHook); ok {
		return h.Recovering(cause)
	}
	return nil
}

// RecoveredHook is told where a recoverer put a delivery: to (an exchange
// and routing key, for the log), after how many failed attempts, and
// whether that is a dead letter or a hop on the way to another try (a
// broker-side retry tier). middleware.Recover tells it once more after
// every successful recovery with to "" (and the attempts it counted): that
// marks the recovery done, and keeps what the recoverer said, if anything.
// attempts 0 means not known.
type RecoveredHook interface {
	RecoveredTo(to string, attempts int, deadLetter bool)
}

// RecoveredTo tells the RecoveredHook in ctx, if any, where a recoverer put
// the delivery: a dead letter unless ctx is marked WithRetryHop.
func RecoveredTo(ctx context.Context, to string, attempts int) {
	if h, ok := ctx.Value(recoveryHookKey).(RecoveredHook); ok {
		h.RecoveredTo(to, attempts, ctx.Value(retryHopKey) == nil)
	}
}

// SettlementDeferrer is what the listener's delivery answers for under
// RecoveryHookKey when its settlement may wait for an outcome that comes
// later, on another goroutine: a recoverer's publish whose confirm is
// awaited without parking a goroutine per message.
type SettlementDeferrer interface {
	// DeferSettlement says that the chain's outcome will be told later,
	// once, through the returned DeferredSettlement, whatever the chain
	// returns now; the delivery stays unsettled until then. s is nil where
	// it cannot. ctx is the context for the work meanwhile: the chain's
	// values, ended only by the listener (shutdown, a lost channel), not by
	// anything in the chain.
	DeferSettlement(chain context.Context) (ctx context.Context, s DeferredSettlement)
}

// DeferredSettlement is a delivery whose settlement waits for the outcome
// of its recovery. It is an object the listener has already (the
// delivery), where a func for each method would cost an allocation per
// failed message on the poison path.
type DeferredSettlement interface {
	// Outcome tells the chain's outcome, once, on any goroutine: the
	// delivery settles by it.
	Outcome(err error)
	// Undo takes the deferral back, before anything was started, on the
	// chain's goroutine: the chain settles as it returns after all.
	Undo()
}

// DeferSettlement asks the SettlementDeferrer in ctx, if any, to settle the
// delivery when s's Outcome is called rather than when the chain returns.
// ok is false where nobody can (a consumer of your own, batch mode): then
// the caller must wait for the outcome itself.
func DeferSettlement(chain context.Context) (ctx context.Context, s DeferredSettlement, ok bool) {
	if h, yes := chain.Value(recoveryHookKey).(SettlementDeferrer); yes {
		if ctx, s = h.DeferSettlement(chain); s != nil {
			return ctx, s, true
		}
	}
	return nil, nil, false
}

// WithRetryHop marks a recovery as a hop to a retry (a tier), not a dead
// letter.
func WithRetryHop(ctx context.Context) context.Context {
	return context.WithValue(ctx, retryHopKey, true)
}
