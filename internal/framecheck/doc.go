// Package framecheck lets a connection read past a message amqp091-go cannot
// parse: wrap the socket with Guard, and a content header whose header table
// amqp091-go v1.16.0 would refuse (tables or arrays nested below level 32, a
// table or array of more than 8,192 entries, a field type it does not know)
// reaches amqp091-go with that table replaced by one header,
// amqphdr.UnreadableHeaders, saying why. Without it amqp091-go closes the
// whole connection (501 FRAME_ERROR), and a tool that looks at a queue stops
// at the message for ever. The broker keeps the message as it was sent: a
// reader must hand such a delivery back (or reject it), never republish the
// altered copy.
package framecheck
