// Package telemetry holds the library's OpenTelemetry plumbing: the tracer,
// propagators and instruments built from a Config that defaults to the
// global providers, the attribute keys and outcomes every package records
// with, a carrier for AMQP header tables, and the context key through which
// a listener hands its telemetry to the middlewares of its chain.
package telemetry
