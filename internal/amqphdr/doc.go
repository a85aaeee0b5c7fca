// Package amqphdr is what the library knows about the headers RabbitMQ and
// Spring put on a message: read x-death and x-delivery-count with it, ask it
// which headers are the broker's, and where a dead letter was first
// published. Every reader is tolerant: a header of the wrong type or with a
// wild value reads as absent, never a panic.
package amqphdr
