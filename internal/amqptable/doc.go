// Package amqptable prepares AMQP header tables for the wire: Normalize
// widens Go ints that amqp091 would truncate to 32 bits, and Size reports how
// many bytes a table takes in a content header frame, which must fit in the
// connection's frame_max.
package amqptable
