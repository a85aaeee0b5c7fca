package testlog

import (
	"log/slog"
	"strings"
	"sync"
)

// Buffer keeps what is written to it; it is safe for concurrent use. The
// zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Count is how often s occurs in what was written.
func (b *Buffer) Count(s string) int { return strings.Count(b.String(), s) }

// Logger writes text records of every level, debug included, to b.
func (b *Buffer) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
