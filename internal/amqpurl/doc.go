// Package amqpurl checks AMQP URLs and hides their passwords: call Redact
// before a URL goes into a log line, an error or a header.
package amqpurl
