// Package amqpconn dials an AMQP connection and keeps its socket, so that a
// connection being given up can always be torn down: call Abandon.
//
// amqp091 holds a channel's lock while it writes to the socket. When a write
// blocks (a broker that stopped reading, a partition) and the connection shuts
// down, amqp091's shutdown waits for that lock before it closes the socket,
// which is the only thing that would unblock the write: both wait forever.
// Closing the socket ourselves breaks the tie.
package amqpconn
