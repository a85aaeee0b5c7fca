package telemetry

import semconv "go.opentelemetry.io/otel/semconv/v1.39.0"

// Attribute keys of the library's spans and metrics, declared here and only
// here: OpenTelemetry's messaging conventions (semconv v1.39.0) and the
// library's own.
const (
	KeyMessagingSystem  = string(semconv.MessagingSystemKey)          // messaging.system
	KeyOperationName    = string(semconv.MessagingOperationNameKey)   // messaging.operation.name
	KeyDestinationName  = string(semconv.MessagingDestinationNameKey) // messaging.destination.name
	KeyErrorType        = string(semconv.ErrorTypeKey)                // error.type
	KeyExceptionMessage = string(semconv.ExceptionMessageKey)         // exception.message

	KeyAttempt    = "amqpretry.attempt"     // an attempt span's number, 1-based
	KeyOutcome    = "amqpretry.outcome"     // how an attempt or a recovery ended: an Outcome
	KeyRetryDelay = "amqpretry.retry.delay" // seconds until the next attempt, on the "retry scheduled" event
	KeyRetryRule  = "amqpretry.retry.rule"  // the retry rule that decided after a failed attempt
	KeySettlement = "amqpretry.settlement"  // how the listener settled a delivery
	KeyBatchIndex = "amqpretry.batch.index" // a message's place in its batch, 0-based, on a batch span's events
)

// SystemRabbitMQ is the value of messaging.system.
const SystemRabbitMQ = "rabbitmq"

// Operation names (messaging.operation.name) of the process and publish
// spans and metrics.
const (
	OperationProcess = "process"
	OperationSend    = "send"
)
