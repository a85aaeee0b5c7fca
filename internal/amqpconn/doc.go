// Package amqpconn is the one place the library dials RabbitMQ: fill a Config,
// call Dial, and between dials after a lost connection wait on a Redialer.
//
// The listener, the publisher and the CLI all connect through it, so the
// connection settings (heartbeat, TLS, locale, connection name, dial timeout)
// and the redial pacing are written once, and so is the list of addresses a
// cluster is reached at: Dial tries Config.URLs in order and says which one
// answered.
//
// A Conn keeps its socket, so that a connection being given up can always be
// torn down: call Abandon. amqp091 holds a channel's lock while it writes to
// the socket. When a write blocks (a broker that stopped reading, a
// partition) and the connection shuts down, amqp091's shutdown waits for that
// lock before it closes the socket, which is the only thing that would
// unblock the write: both wait forever. Closing the socket ourselves breaks
// the tie.
package amqpconn
