package console

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/escape"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/recoverer"
)

// Headers an edited replay adds to its copy, after the header prefix.
const (
	SuffixEditedBy = "edited-by"
	SuffixEditedAt = "edited-at"
)

// Edit is what an operator changed of one dead letter before replaying it:
// its body and its application headers (the headers a replay keeps).
type Edit struct {
	Body    []byte
	Headers amqp.Table
	Who     string
	At      time.Time
}

// editingPublisher publishes the one message an edited replay takes with
// the edit's body and application headers, and marks it edited, by whom and
// when; what dlx.Replay wrote besides (the replay history) stays.
type editingPublisher struct {
	recoverer.Publisher
	edit   Edit
	prefix string
}

func (p editingPublisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	headers := amqp.Table{}
	for k, v := range msg.Headers {
		if strings.HasPrefix(k, p.prefix) { // the history dlx.Replay keeps
			headers[k] = v
		}
	}
	maps.Copy(headers, p.edit.Headers)
	headers[p.prefix+SuffixEditedBy] = p.edit.Who
	headers[p.prefix+SuffixEditedAt] = p.edit.At.UTC().Format(time.RFC3339Nano)
	msg.Headers, msg.Body = headers, p.edit.Body
	return p.Publisher.Publish(ctx, exchange, key, msg)
}

// appHeaders are the headers of d an edit shows and may change: those a
// replay keeps (not the fault, retry, death or routing ones, nor any with
// the recoverer's prefix) whose values JSON can carry; kept are the others
// of them (byte arrays, timestamps, decimals), which a replay keeps as
// they are.
func appHeaders(h amqp.Table, prefix string) (editable, kept amqp.Table) {
	editable, kept = amqp.Table{}, amqp.Table{}
	for k, v := range h {
		if !isAppHeader(k, prefix) {
			continue
		}
		if jsonable(v) {
			editable[k] = v
		} else {
			kept[k] = v
		}
	}
	return editable, kept
}

// isAppHeader reports whether a replay keeps header k of a dead letter.
func isAppHeader(k, prefix string) bool {
	switch k {
	case recoverer.HeaderExceptionMessage, recoverer.HeaderExceptionStacktrace,
		recoverer.HeaderOriginalExchange, recoverer.HeaderOriginalRoutingKey, "x-retry-count":
		return false
	}
	return !amqphdr.IsBrokerOwned(k) && !amqphdr.IsSenderRouting(k) && (prefix == "" || !strings.HasPrefix(k, prefix))
}

// jsonable reports whether v survives a trip through JSON as the edit form
// carries it: text, whole numbers, floats, booleans, and tables and arrays
// of them.
func jsonable(v any) bool {
	switch v := v.(type) {
	case string, bool, int8, int16, int32, int64, int, uint8, uint16, uint32:
		return true
	case float32:
		return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0)
	case float64:
		return !math.IsNaN(v) && !math.IsInf(v, 0)
	case amqp.Table:
		for _, x := range v {
			if !jsonable(x) {
				return false
			}
		}
		return true
	case []any:
		for _, x := range v {
			if !jsonable(x) {
				return false
			}
		}
		return true
	}
	return false
}

// headersJSON is an edit form's headers: a JSON object, keys sorted.
func headersJSON(h amqp.Table) string {
	if len(h) == 0 {
		return "{}"
	}
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return "{}"
	}
	return string(b)
}

// parseHeaders reads an edit form's headers: a JSON object whose values are
// text, numbers (whole ones as 64-bit integers), booleans, objects (tables)
// or arrays. A name the replay would drop, or that claims to be the broker's
// or the recoverer's, is refused.
func parseHeaders(text, prefix string) (amqp.Table, error) {
	text = strings.TrimSpace(text)
	if text == "" {
		return amqp.Table{}, nil
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("the headers are not a JSON object: %v", err)
	}
	if dec.More() {
		return nil, errors.New("the headers hold more than one JSON object")
	}
	out := amqp.Table{}
	for k, v := range raw {
		switch {
		case k == "" || len(k) > 255:
			return nil, fmt.Errorf("header name %q: want 1 to 255 bytes", escape.Line(k))
		case !isAppHeader(k, prefix):
			return nil, fmt.Errorf("header %s is the broker's, the recoverer's or a routing one: an edit changes application headers only", escape.Line(k))
		case v == nil:
			return nil, fmt.Errorf("header %s is null: remove it instead", escape.Line(k))
		}
		value, err := tableValue(v)
		if err != nil {
			return nil, fmt.Errorf("header %s: %v", escape.Line(k), err)
		}
		out[k] = value
	}
	if err := out.Validate(); err != nil {
		return nil, fmt.Errorf("the headers: %v", err)
	}
	return out, nil
}

// tableValue is a decoded JSON value as an AMQP field value.
func tableValue(v any) (any, error) {
	switch v := v.(type) {
	case string, bool:
		return v, nil
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n, nil
		}
		f, err := v.Float64()
		if err != nil || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%s is not a number a header holds", v)
		}
		return f, nil
	case map[string]any:
		t := amqp.Table{}
		for k, x := range v {
			value, err := tableValue(x)
			if err != nil {
				return nil, err
			}
			t[k] = value
		}
		return t, nil
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			value, err := tableValue(x)
			if err != nil {
				return nil, err
			}
			out[i] = value
		}
		return out, nil
	case nil:
		return nil, errors.New("null is not a header value")
	}
	return nil, fmt.Errorf("%T is not a header value", v)
}

// saysJSON reports whether a content type names JSON: application/json,
// text/json, or a +json suffix.
func saysJSON(contentType string) bool {
	mt, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(contentType)), ";")
	mt = strings.TrimSpace(mt)
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// contentDigest names a dead letter's content, its body, headers and
// properties, whatever its message id: an edit confirmed for one content
// is refused for another.
func contentDigest(d *amqp.Delivery) string {
	c := *d
	c.MessageId = ""
	return strings.TrimPrefix(Key(&c), "fp:")
}

// editView is what the edit and review pages show.
type editView struct {
	Queue, Ref, GroupID string
	By                  GroupBy
	M                   *Message
	Body                string // the form's body text
	BodyUTF8            bool   // the original body is UTF-8 text (else the form starts empty)
	Headers             string // the form's headers, JSON
	Kept                []headerView
	ContentType         string
	JSON                bool // the content type says JSON: the body must be JSON
	Dest                Destination
	Digest              string
	Problem             string
	EditedBy            string // the header that marks the copy
	// Review: what the edit changes, for the confirmation.
	Review         bool
	BodyChanged    bool
	HeaderChanges  []string
	OriginalBody   bodyView
	EditedBodyView bodyView
}

// editTarget is the message an edit form names, or nil after answering why
// there is none: not one of the console's queues, an archive, no such
// message, or several messages with its key.
func (c *Console) editTarget(w http.ResponseWriter, r *http.Request, s *session) (*Snapshot, *Message) {
	q, key := r.FormValue("q"), Unref(r.FormValue("k"))
	if IsArchive(q) {
		c.fail(w, r, s, http.StatusBadRequest, "An archived message is restored as it was; replay it from its queue to edit it.")
		return nil, nil
	}
	snap := c.pageSnapshot(w, r, s, q)
	if snap == nil {
		return nil, nil
	}
	msgs := snap.ByKey(key)
	switch len(msgs) {
	case 0:
		c.fail(w, r, s, http.StatusNotFound, "No message "+escape.Line(key)+" in the latest look at "+escape.Line(q)+": it may have been replayed or deleted.")
		return nil, nil
	case 1:
		return snap, msgs[0]
	}
	c.fail(w, r, s, http.StatusConflict, fmt.Sprintf("%d messages of %s carry the key %s: an edit replays one message, so it is refused here. Replay them as they are, or delete the ones you do not want first.",
		len(msgs), escape.Line(q), escape.Line(key)))
	return nil, nil
}

// editForm shows the form that edits one dead letter (GET /edit).
func (c *Console) editForm(w http.ResponseWriter, r *http.Request, s *session) {
	if c.cfg.ReadOnly {
		c.fail(w, r, s, http.StatusForbidden, "Refused: this console is read-only (amqpretry console --read-only).")
		return
	}
	snap, m := c.editTarget(w, r, s)
	if m == nil {
		return
	}
	d := &m.Delivery
	editable, _ := appHeaders(d.Headers, c.prefix)
	v := c.newEditView(snap, m, r)
	v.Headers = headersJSON(editable)
	if v.BodyUTF8 {
		v.Body = string(d.Body)
	}
	c.render.page(w, http.StatusOK, "edit", c.view(s, "Edit and replay", v))
}

func (c *Console) newEditView(snap *Snapshot, m *Message, r *http.Request) editView {
	d := &m.Delivery
	_, kept := appHeaders(d.Headers, c.prefix)
	v := editView{Queue: snap.Queue, Ref: m.Ref(), GroupID: r.FormValue("g"), By: groupByOf(r), M: m,
		BodyUTF8: utf8.Valid(d.Body), Kept: headersOf(kept), ContentType: d.ContentType, JSON: saysJSON(d.ContentType),
		Dest: Destination{Kind: "original"}, Digest: contentDigest(d), EditedBy: c.prefix + SuffixEditedBy}
	return v
}

// editPost reviews an edit (step review) or replays it (confirm=yes), as
// every action: a POST from the console's own pages with the session's
// CSRF token, refused when read-only (Console.change).
func (c *Console) editPost(w http.ResponseWriter, r *http.Request, s *session) {
	snap, m := c.editTarget(w, r, s)
	if m == nil {
		return
	}
	d := &m.Delivery
	v := c.newEditView(snap, m, r)
	v.Body, v.Headers = r.PostFormValue("body"), r.PostFormValue("headers")
	v.Dest = Destination{Kind: r.PostFormValue("to"), Queue: strings.TrimSpace(r.PostFormValue("to_queue"))}
	again := func(status int, problem string) {
		v.Problem, v.Review = problem, false
		c.render.page(w, status, "edit", c.view(s, "Edit and replay", v))
	}
	if r.PostFormValue("digest") != v.Digest {
		again(http.StatusConflict, "This message has changed since the form was shown (a later look found it different): check the form again.")
		return
	}
	body := []byte(v.Body)
	if v.JSON && !json.Valid(body) {
		again(http.StatusBadRequest, "The body is not valid JSON, which its content type ("+escape.Line(d.ContentType)+") says it is. Nothing was replayed.")
		return
	}
	headers, err := parseHeaders(v.Headers, c.prefix)
	if err != nil {
		again(http.StatusBadRequest, err.Error()+". Nothing was replayed.")
		return
	}
	if _, err := v.Dest.option(); err != nil {
		again(http.StatusBadRequest, "Nothing was replayed: "+err.Error()+".")
		return
	}
	if r.PostFormValue("confirm") == "edit" {
		again(http.StatusOK, "")
		return
	}
	editable, kept := appHeaders(d.Headers, c.prefix)
	merged := maps.Clone(kept) // headers JSON cannot carry stay as they were
	maps.Copy(merged, headers)
	if r.PostFormValue("confirm") != "yes" {
		v.Review = true
		v.BodyChanged = !bytes.Equal(body, d.Body)
		v.HeaderChanges = headerChanges(editable, headers)
		v.OriginalBody, v.EditedBodyView = viewBody(d.Body, ""), viewBody(body, "")
		c.render.page(w, http.StatusOK, "edit", c.view(s, "Confirm edit and replay", v))
		return
	}
	edit := Edit{Body: body, Headers: merged, Who: s.who, At: time.Now()}
	actx, cancel := context.WithCancel(c.base())
	defer cancel()
	var group *Group
	if g := findGroup(snap, v.By, v.GroupID); g != nil && g.Has(m) {
		group = g
	}
	sel := TickedSelection(snap, group, []string{m.Key})
	out := c.EditAndReplay(actx, snap.Queue, sel, v.Dest, edit, v.Digest)
	entry := c.entry(r, s, out)
	entry.Messages, entry.MessagesNotListed = auditKeys([]string{m.Key})
	entry.Edit = auditEdit(d, edit)
	c.finish(w, r, s, out, entry)
}

// EditAndReplay replays the message sel selects on queue to dest, as
// Replay does (published, confirmed, then acked), with edit's body and
// application headers, marked edited by edit.Who; only a message whose
// content is still the one digest names (contentDigest) is taken.
func (c *Console) EditAndReplay(ctx context.Context, queue string, sel Selection, dest Destination, edit Edit, digest string) Outcome {
	return c.move(ctx, "edit", queue, sel, dest, edit.Who, &editRun{edit: edit, digest: digest})
}

// editRun is what move needs of an edited replay.
type editRun struct {
	edit   Edit
	digest string
}

// headerChanges lists what an edit does to the editable headers: "added
// tenant", "changed priority", "removed trace".
func headerChanges(before, after amqp.Table) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(after)) {
		old, had := before[k]
		switch {
		case !had:
			out = append(out, "added "+k)
		case headerJSONValue(old) != headerJSONValue(after[k]):
			out = append(out, "changed "+k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if _, has := after[k]; !has {
			out = append(out, "removed "+k)
		}
	}
	return out
}

func headerJSONValue(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// AuditEdit is what an audit line keeps of an edited replay: the original
// in full (its body as text, or base64 when it is not UTF-8) and what
// replaced it.
type AuditEdit struct {
	OriginalBody         string         `json:"original_body"`
	OriginalBodyEncoding string         `json:"original_body_encoding"` // "utf-8" or "base64"
	OriginalHeaders      map[string]any `json:"original_headers"`
	OriginalContentType  string         `json:"original_content_type,omitempty"`
	OriginalDigest       string         `json:"original_digest"` // SHA-256 of the original body, hex
	EditedBody           string         `json:"edited_body"`
	EditedHeaders        map[string]any `json:"edited_headers"`
}

func auditEdit(d *amqp.Delivery, edit Edit) *AuditEdit {
	sum := sha256.Sum256(d.Body)
	a := &AuditEdit{OriginalHeaders: auditTable(d.Headers), OriginalContentType: d.ContentType,
		OriginalDigest: hex.EncodeToString(sum[:]), EditedBody: string(edit.Body), EditedHeaders: auditTable(edit.Headers)}
	if utf8.Valid(d.Body) {
		a.OriginalBody, a.OriginalBodyEncoding = string(d.Body), "utf-8"
	} else {
		a.OriginalBody, a.OriginalBodyEncoding = base64.StdEncoding.EncodeToString(d.Body), "base64"
	}
	return a
}

// auditTable is h as an audit line holds it: what JSON cannot (a NaN or an
// infinite float) as fmt prints it, so that the line is always written.
func auditTable(h amqp.Table) map[string]any {
	out := make(map[string]any, len(h))
	for k, v := range h {
		out[k] = auditValue(v)
	}
	return out
}

func auditValue(v any) any {
	switch v := v.(type) {
	case float32:
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Sprint(v)
		}
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Sprint(v)
		}
	case amqp.Table:
		return auditTable(v)
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = auditValue(x)
		}
		return out
	}
	return v
}
