package telemetry

// ScopeName is the instrumentation scope of every span and metric.
const ScopeName = "github.com/amqpretry/amqpretry"

// Version is the library's version, reported with the scope.
const Version = "0.1.0"
