package console

import (
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/deadletter"
	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/recoverer"
)

// Message is one dead letter of a snapshot: the delivery as it was taken
// (handed back since) and what grouping reads of it.
type Message struct {
	Delivery amqp.Delivery
	// Key names the message in actions: "id:" and its message id, or, for
	// a message without one, "fp:" and a fingerprint of its body and
	// headers (Key).
	Key string
	// Index is the message's place in the snapshot, 0 at the head.
	Index         int
	OriginalQueue string
	ErrorType     string
	Exception     string // x-exception-message, raw
	Stack         string // x-exception-stacktrace, raw
	Attempts      string
	FailedAt      time.Time // zero when no header says
	// Replayed is how often the message was replayed before it
	// failed again (dlx.ReplayKeepHistory), and Previous what it failed
	// with before the last replay.
	Replayed int
	Previous Previous
}

// Previous is what a replayed message failed with before its last replay,
// as its history headers say (raw).
type Previous struct {
	Exception, ErrorType, FailedAt string
}

// fingerprintSkips are headers left out of a fingerprint: a quorum queue
// raises x-delivery-count each time a message is handed back, so a look
// would change the key of the message it looked at.
var fingerprintSkips = map[string]bool{amqphdr.XDeliveryCount: true}

// Key is what actions know a message by: its message id, which survives
// the message being handed back and taken again, or where it has none a
// fingerprint of its body, headers and properties (SHA-256, 128 bits).
func Key(d *amqp.Delivery) string {
	if d.MessageId != "" {
		return "id:" + d.MessageId
	}
	h := sha256.New()
	writeField := func(s string) {
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	writeField(d.ContentType)
	writeField(d.ContentEncoding)
	writeField(d.CorrelationId)
	writeField(d.Type)
	writeField(d.AppId)
	writeField(fmt.Sprint(d.Timestamp.Unix())) // AMQP keeps seconds; UnixNano overflows past 2262
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		if fingerprintSkips[k] {
			continue
		}
		writeField(k)
		// %T and %v of a header value are deterministic: fmt prints maps
		// (nested tables) with their keys sorted.
		writeField(fmt.Sprintf("%T=%v", d.Headers[k], d.Headers[k]))
	}
	writeField(string(d.Body))
	return "fp:" + hex.EncodeToString(h.Sum(nil)[:16])
}

// newMessage reads what grouping needs from a delivery. prefix is the
// recoverer's header prefix.
func newMessage(d amqp.Delivery, index int, prefix string) *Message {
	m := &Message{Delivery: d, Key: Key(&d), Index: index}
	h := d.Headers
	str := func(k string) string { s, _ := h[k].(string); return s }
	m.OriginalQueue = str(prefix + recoverer.SuffixOriginalQueue)
	m.ErrorType = str(prefix + recoverer.SuffixErrorType)
	m.Exception = str(recoverer.HeaderExceptionMessage)
	m.Stack = str(recoverer.HeaderExceptionStacktrace)
	m.Replayed, _ = amqphdr.Count(h[prefix+dlx.SuffixReplayed])
	m.Previous = Previous{Exception: str(prefix + dlx.SuffixPreviousException),
		ErrorType: str(prefix + dlx.SuffixPreviousErrorType), FailedAt: str(prefix + dlx.SuffixPreviousFailedAt)}
	if v, ok := h[prefix+recoverer.SuffixAttempts]; ok && v != nil {
		m.Attempts = fmt.Sprint(v)
	}
	if t, err := time.Parse(time.RFC3339Nano, str(prefix+recoverer.SuffixFailedAt)); err == nil {
		m.FailedAt = t
	}
	// Dead-lettered by the broker itself (a Reject, a Permanent error
	// without a recoverer, an expiry, a delivery limit): its x-death says
	// where from and why.
	deaths := amqphdr.Deaths(h)
	if len(deaths) > 0 {
		first := deaths[len(deaths)-1]
		if m.OriginalQueue == "" {
			m.OriginalQueue = first.Queue
		}
		if m.ErrorType == "" && first.Reason != "" {
			m.ErrorType = "dead-lettered by the broker: " + first.Reason
		}
		if m.FailedAt.IsZero() {
			m.FailedAt = deaths[0].Time
		}
	}
	if m.OriginalQueue == "" {
		m.OriginalQueue = deadletter.Header(&d, amqphdr.XFirstDeathQueue)
	}
	if m.FailedAt.IsZero() {
		m.FailedAt = d.Timestamp
	}
	return m
}

// GroupBy says what makes two dead letters one group.
type GroupBy string

const (
	// ByCause groups by original queue, error type and the normalised
	// exception message.
	ByCause GroupBy = "cause"
	// ByStack groups by original queue, error type and the normalised stack
	// trace (or error chain).
	ByStack GroupBy = "stack"
)

// Group is the dead letters of a snapshot that share a cause.
type Group struct {
	ID            string  // stable for the same cause across snapshots
	By            GroupBy // what its messages share
	OriginalQueue string
	ErrorType     string
	Signature     string // the normalised exception message or stack
	Example       string // the first member's exception message (or stack), raw
	Messages      []*Message
	FirstFailed   time.Time
	LastFailed    time.Time
}

// Count is the number of dead letters in the group.
func (g *Group) Count() int { return len(g.Messages) }

// Keys returns the keys of the group's messages, each with how many of
// them carry it.
func (g *Group) Keys() map[string]int {
	keys := make(map[string]int, len(g.Messages))
	for _, m := range g.Messages {
		keys[m.Key]++
	}
	return keys
}

// Has reports whether m belongs in g: the same original queue, error type
// and signature.
func (g *Group) Has(m *Message) bool {
	if m.OriginalQueue != g.OriginalQueue || m.ErrorType != g.ErrorType {
		return false
	}
	sig, _ := signatureOf(m, g.By)
	return sig == g.Signature
}

// signatureOf is what m is grouped by under by, normalised, with the raw
// text it came from.
func signatureOf(m *Message, by GroupBy) (signature, raw string) {
	raw = m.Exception
	if by == ByStack {
		raw = m.Stack
	}
	return Normalize(raw), raw
}

// groupID is a short stable id of a group's key.
func groupID(by GroupBy, originalQueue, errorType, signature string) string {
	h := sha256.New()
	for _, s := range []string{string(by), originalQueue, errorType, signature} {
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Groups groups msgs by, largest group first (then by original queue,
// error type and signature, so the order is stable).
func Groups(msgs []*Message, by GroupBy) []*Group {
	type key struct{ queue, errorType, signature string }
	index := make(map[key]*Group)
	var groups []*Group
	for _, m := range msgs {
		sig, raw := signatureOf(m, by)
		k := key{m.OriginalQueue, m.ErrorType, sig}
		g := index[k]
		if g == nil {
			g = &Group{By: by, OriginalQueue: m.OriginalQueue, ErrorType: m.ErrorType, Signature: sig, Example: raw}
			index[k] = g
			groups = append(groups, g)
		}
		g.Messages = append(g.Messages, m)
		if !m.FailedAt.IsZero() {
			if g.FirstFailed.IsZero() || m.FailedAt.Before(g.FirstFailed) {
				g.FirstFailed = m.FailedAt
			}
			if m.FailedAt.After(g.LastFailed) {
				g.LastFailed = m.FailedAt
			}
		}
	}
	for _, g := range groups {
		g.ID = groupID(by, g.OriginalQueue, g.ErrorType, g.Signature)
	}
	slices.SortStableFunc(groups, func(a, b *Group) int {
		return cmp.Or(cmp.Compare(b.Count(), a.Count()), strings.Compare(a.OriginalQueue, b.OriginalQueue),
			strings.Compare(a.ErrorType, b.ErrorType), strings.Compare(a.Signature, b.Signature))
	})
	return groups
}

// refPrefix marks a Ref that is a key in base64url.
const refPrefix = "b64:"

// Ref is m's key as forms and links carry it (Ref).
func (m *Message) Ref() string { return Ref(m.Key) }

// Ref is key as forms and links carry it: the key itself when it is
// printable ASCII, else "b64:" and its base64url form, so that no control or
// bidi character of a message id reaches a page, not even in an attribute.
// Unref reverses it.
func Ref(key string) string {
	for i := range len(key) {
		if key[i] < 0x20 || key[i] > 0x7e {
			return refPrefix + base64.RawURLEncoding.EncodeToString([]byte(key))
		}
	}
	if strings.HasPrefix(key, refPrefix) {
		return refPrefix + base64.RawURLEncoding.EncodeToString([]byte(key))
	}
	return key
}

// Unref is the key a Ref stands for.
func Unref(ref string) string {
	if rest, ok := strings.CutPrefix(ref, refPrefix); ok {
		if key, err := base64.RawURLEncoding.DecodeString(rest); err == nil {
			return string(key)
		}
	}
	return ref
}
