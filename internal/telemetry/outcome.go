package telemetry

import "go.opentelemetry.io/otel/attribute"

// Outcome is how an attempt or a recovery ended: the amqpretry.outcome
// attribute of the attempt spans, of amqpretry.attempts and of
// amqpretry.recoveries. Adding one takes a constant and its name below.
type Outcome uint8

const (
	OutcomeSucceeded      Outcome = iota // the handler returned nil
	OutcomeRetrying                      // failed; Retry waits and tries again
	OutcomeExhausted                     // failed; no attempt left
	OutcomePermanent                     // failed with a Permanent error
	OutcomeNotRetryable                  // failed; RetryIf said no
	OutcomeTimeLimited                   // failed; the time limit leaves no room for another
	OutcomeHandedOff                     // failed; the next wait is past HandOffAfter
	OutcomeInterrupted                   // shutdown or a cancelled context
	OutcomeRecovered                     // handed to the recoverer, which succeeded
	OutcomeRejected                      // the recoverer asked for a reject without requeue (recoveries)
	OutcomeRecoveryFailed                // the recoverer failed (recoveries)
	OutcomeRedelivered                   // the recoverer handed it back for the broker to redeliver (recoveries)

	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	OutcomeSucceeded:      "succeeded",
	OutcomeRetrying:       "retrying",
	OutcomeExhausted:      "exhausted",
	OutcomePermanent:      "permanent",
	OutcomeNotRetryable:   "not_retryable",
	OutcomeTimeLimited:    "time_limited",
	OutcomeHandedOff:      "handed_off",
	OutcomeInterrupted:    "interrupted",
	OutcomeRecovered:      "recovered",
	OutcomeRejected:       "rejected",
	OutcomeRecoveryFailed: "failed",
	OutcomeRedelivered:    "redelivered",
}

// outcomeAttrs are the span attributes of the outcomes, built once.
var outcomeAttrs = func() (attrs [numOutcomes]attribute.KeyValue) {
	for o, name := range outcomeNames {
		attrs[o] = attribute.String(KeyOutcome, name)
	}
	return attrs
}()

func (o Outcome) String() string { return outcomeNames[o] }

// Attr is the outcome as a span attribute.
func (o Outcome) Attr() attribute.KeyValue { return outcomeAttrs[o] }
