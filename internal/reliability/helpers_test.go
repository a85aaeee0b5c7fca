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
	shared *book
	attrs  string // from WithAttrs, on every record of this handler
}

type book struct {
	mu      sync.Mutex
	records []logRecord
}

type logRecord struct {
	at   time.Time
	text string // message and attributes
}

func newLogBook() *logBook { return &logBook{shared: &book{}} }

func (b *logBook) logger() *slog.Logger { return slog.New(b) }

func (b *logBook) Enabled(context.Context, slog.Level) bool { return true }

func (b *logBook) Handle(_ context.Context, r slog.Record) error {
	var sb strings.Builder
	sb.WriteString(r.Message + b.attrs)
	r.Attrs(func(a slog.Attr) bool {
		sb.WriteString(" " + a.String())
		return true
	})
	b.shared.mu.Lock()
	defer b.shared.mu.Unlock()
	b.shared.records = append(b.shared.records, logRecord{at: r.Time, text: sb.String()})
	return nil
}

// WithAttrs keeps the attributes, so that a secret passed to logger.With
// would show in the book too.
func (b *logBook) WithAttrs(attrs []slog.Attr) slog.Handler {
	extra := b.attrs
	for _, a := range attrs {
		extra += " " + a.String()
	}
	return &logBook{shared: b.shared, attrs: extra}
}

func (b *logBook) WithGroup(name string) slog.Handler {
	return &logBook{shared: b.shared, attrs: b.attrs + " " + name + ":"}
}

// first returns when a record containing s was first logged after since.
func (b *logBook) first(s string, since time.Time) (time.Time, bool) {
	b.shared.mu.Lock()
	defer b.shared.mu.Unlock()
	for _, r := range b.shared.records {
		if !r.at.Before(since) && strings.Contains(r.text, s) {
			return r.at, true
		}
	}
	return time.Time{}, false
}

func (b *logBook) all() string {
	b.shared.mu.Lock()
	defer b.shared.mu.Unlock()
	var sb strings.Builder
	for _, r := range b.shared.records {
		sb.WriteString(r.text + "\n")
	}
	return sb.String()
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
