package telemetry

import (
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
)

// TableCarrier adapts AMQP headers to the propagators: traceparent travels
// as a string header, as OpenTelemetry's messaging conventions ask.
type TableCarrier amqp.Table

var _ propagation.TextMapCarrier = TableCarrier(nil)

// Get returns a string header; a header of another type reads as absent
// (some clients write long strings as bytes, which are accepted too).
func (c TableCarrier) Get(key string) string {
	switch v := c[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// Set writes a string header.
func (c TableCarrier) Set(key, value string) { c[key] = value }

// Keys lists the headers.
func (c TableCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
