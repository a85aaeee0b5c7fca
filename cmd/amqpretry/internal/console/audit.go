package console

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/escape"
)

// maxAuditKeys bounds the message keys one audit line lists.
const maxAuditKeys = 1000

// AuditEntry is one line of the audit log: who did what to which messages,
// and what came of it.
type AuditEntry struct {
	Time   time.Time `json:"time"`
	Who    string    `json:"who"`    // the name of the token the session was bought with
	Remote string    `json:"remote"` // the client's address
	Action string    `json:"action"` // replay, edit, delete, restore, purge, outbox-retry
	Queue  string    `json:"queue,omitempty"`
	// Group is the group acted on, when the action named one: its id and
	// signature.
	Group       string `json:"group,omitempty"`
	Destination string `json:"destination,omitempty"`
	// Messages are the keys asked for ("id:<message id>" or "fp:<hash>"),
	// escaped as the pages show them, at most maxAuditKeys; the rest are
	// counted in MessagesNotListed.
	Messages          []string `json:"messages,omitempty"`
	MessagesNotListed int      `json:"messages_not_listed,omitempty"`
	Requested         int      `json:"requested"`
	Done              int      `json:"done"`
	Left              int      `json:"left"` // of those asked for, still on the queue; -1 unknown
	Depth             int      `json:"depth"`
	Outcome           string   `json:"outcome"` // "ok" or "failed"
	Summary           string   `json:"summary"`
	Error             string   `json:"error,omitempty"`
	// Edit is an edited replay's original, in full, and its edit.
	Edit *AuditEdit `json:"edit,omitempty"`
}

// auditLog appends JSON lines to w, one at a time.
type auditLog struct {
	mu     sync.Mutex
	w      io.Writer
	recent []AuditEntry // the latest, newest first, for the overview
}

// maxRecent is how many actions the overview lists.
const maxRecent = 20

// record writes e. An audit line that cannot be written is an error the
// page reports: the action happened, its record did not.
func (a *auditLog) record(e AuditEntry) error {
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recent = append([]AuditEntry{e}, a.recent[:min(len(a.recent), maxRecent-1)]...)
	if _, err := a.w.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	return nil
}

// latest returns the recent actions, newest first.
func (a *auditLog) latest() []AuditEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]AuditEntry(nil), a.recent...)
}

// auditKeys is keys for an audit line: escaped, at most maxAuditKeys.
func auditKeys(keys []string) (listed []string, notListed int) {
	for i, k := range keys {
		if i == maxAuditKeys {
			return listed, len(keys) - i
		}
		listed = append(listed, escape.Line(k))
	}
	return listed, 0
}
