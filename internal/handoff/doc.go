// Package handoff is a queue from goroutines that must never wait to one
// goroutine that takes what they put, in order: a publisher's confirm
// watcher hands finished publishes to the goroutine that calls their done
// funcs, and an outbox relay's done funcs hand relayed rows to the
// goroutine that records them. Put never blocks, so a callback on a
// goroutine that serves others (amqp091's, a confirm watcher) can put; the
// queue grows instead, and whoever feeds it bounds how much is in flight.
package handoff
