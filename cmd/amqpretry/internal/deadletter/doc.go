// Package deadletter is what the CLI's dlq commands and the console share
// about a dead-letter queue: looking at its messages without taking them
// (Look, which takes a snapshot with a consumer and hands every message back
// with one basic.nack before it returns; Peek, HandBack and Return, its
// steps), reading the fault headers a recoverer wrote (Header,
// OriginalKey), and replaying through dlx.Replay (Replay).
package deadletter
