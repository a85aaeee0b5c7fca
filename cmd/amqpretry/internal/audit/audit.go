package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"time"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/console"
	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/escape"
)

// MaxKeys bounds the message keys one line lists, as the console's do; the
// rest are counted.
const MaxKeys = 1000

// Stderr is the path that sends the log to standard error.
const Stderr = "-"

// DefaultPath is where the log goes unless the operator names a file:
// $XDG_STATE_HOME/amqpretry/audit.log, else ~/.local/state/amqpretry/audit.log.
// It is "" when neither can be found.
func DefaultPath() string {
	if dir := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(dir) {
		return filepath.Join(dir, "amqpretry", "audit.log")
	}
	if home, err := os.UserHomeDir(); err == nil && home != "" {
		return filepath.Join(home, ".local", "state", "amqpretry", "audit.log")
	}
	return ""
}

// Log is an open audit log.
type Log struct {
	w     io.Writer
	close func() error
	path  string
}

// Open opens path for appending, making its directory (mode 0700) and the
// file (0600) when they are not there; Stderr writes to stderr.
func Open(path string, stderr io.Writer) (*Log, error) {
	if path == Stderr {
		return &Log{w: stderr, close: func() error { return nil }, path: "standard error"}, nil
	}
	if path == "" {
		return nil, errors.New("audit log: no path ($XDG_STATE_HOME and $HOME are unset): name one with --audit FILE, or --no-audit")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("audit log: %w (name another file with --audit FILE, or --no-audit; nothing was done)", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w (name another file with --audit FILE, or --no-audit; nothing was done)", err)
	}
	return &Log{w: f, close: f.Close, path: path}, nil
}

// Record writes e as one line, with its time and who (the OS user) filled in
// when unset, and its keys escaped and bounded as the console's are.
func (l *Log) Record(e console.AuditEntry) error {
	if l == nil {
		return nil
	}
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	if e.Who == "" {
		e.Who = Who()
	}
	if e.Remote == "" {
		e.Remote = host()
	}
	listed := make([]string, 0, min(len(e.Messages), MaxKeys))
	for i, k := range e.Messages {
		if i == MaxKeys {
			e.MessagesNotListed += len(e.Messages) - i
			break
		}
		listed = append(listed, escape.Line(k))
	}
	e.Messages = listed
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	if _, err := l.w.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("audit log %s: %w: the action was done, its record was not", l.path, err)
	}
	return nil
}

// Close closes the file; a nil Log closes nothing.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	return l.close()
}

// Who is the OS user running the command.
func Who() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if name := os.Getenv("USER"); name != "" {
		return name
	}
	return fmt.Sprintf("uid %d", os.Getuid())
}

// host is the machine's name, where the console writes the client's
// address.
func host() string {
	if h, err := os.Hostname(); err == nil {
		return h
	}
	return ""
}
