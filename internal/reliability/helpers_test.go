package reliability

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// logBook is a slog handler that keeps every record, for tests that look
// at what was logged and when.
type logBook struct {
	mu      sync.Mutex
	records []logRecord
}

type logRecord struct {
	at   time.Time
	text string // message and attributes
}

func newLogBook() *logBook { return &logBook{} }

func (b *logBook) logger() *slog.Logger { return slog.New(b) }

func (b *logBook) Enabled(context.Context, slog.Level) bool { return true }

func (b *logBook) Handle(_ context.Context, r slog.Record) error {
	var sb strings.Builder
	sb.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		sb.WriteString(" " + a.String())
		return true
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	b.records = append(b.records, logRecord{at: r.Time, text: sb.String()})
	return nil
}

func (b *logBook) WithAttrs(attrs []slog.Attr) slog.Handler { return b }
func (b *logBook) WithGroup(string) slog.Handler            { return b }

// first returns when a record containing s was first logged.
func (b *logBook) first(s string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.records {
		if strings.Contains(r.text, s) {
			return r.at, true
		}
	}
	return time.Time{}, false
}

func (b *logBook) all() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var sb strings.Builder
	for _, r := range b.records {
		sb.WriteString(r.text + "\n")
	}
	return sb.String()
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
