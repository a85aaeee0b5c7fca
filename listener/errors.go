package listener

import "errors"

var (
	// ErrQueueNotFound: the queue does not exist (with WithMissingQueueFatal).
	ErrQueueNotFound = errors.New("listener: queue not found")

	// ErrAlreadyRunning: Run was called a second time.
	ErrAlreadyRunning = errors.New("listener: Run called more than once")
)
