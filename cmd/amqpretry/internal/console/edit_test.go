package console

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
)

var digestField = regexp.MustCompile(`name="digest" value="([^"]+)"`)

// editForm reads the edit form of message key on q: its digest.
func (c *client) editDigest(q, key string) string {
	c.t.Helper()
	resp, body := c.get("/edit?q=" + url.QueryEscape(q) + "&k=" + url.QueryEscape(key))
	m := digestField.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		c.t.Fatalf("the edit form: %s\n%s", resp.Status, body)
	}
	return m[1]
}

// An edited replay sends the edited copy, marked edited and by whom, to the
// message's queue, only once confirmed; the audit line keeps the original.
func TestEditAndReplay(t *testing.T) {
	topo := topology(t)
	fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	_, _ = c.get("/") // the look
	form := url.Values{"q": {topo.DLQ()}, "k": {"id:customer-2"}, "digest": {c.editDigest(topo.DLQ(), "id:customer-2")},
		"body": {`{"kind":"customer","n":2,"customer":1014}`}, "headers": {`{"tenant":"acme","priority":3,"nested":{"a":[1,"b",true]}}`}, "to": {"original"}}

	// Refused: JSON that is not, headers that are not a JSON object, or that
	// name the recoverer's.
	for _, tt := range []struct{ field, value, want string }{
		{"body", `{"kind":`, "not valid JSON"},
		{"headers", `["tenant"]`, "not a JSON object"},
		{"headers", `{"x-amqpretry-error-type":"x"}`, "application headers only"},
		{"headers", `{"x-death":"x"}`, "application headers only"},
		{"headers", `{"a":null}`, "is null"},
	} {
		bad := url.Values{}
		for k, v := range form {
			bad[k] = v
		}
		bad.Set(tt.field, tt.value)
		bad.Set("confirm", "yes")
		resp, body := c.post("/edit", bad)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, tt.want) {
			t.Errorf("%s %s: %s, want 400 saying %q\n%s", tt.field, tt.value, resp.Status, tt.want, body)
		}
	}
	// The review changes nothing.
	resp, body := c.post("/edit", form)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="body-change">changed`) || !strings.Contains(body, "added nested, added priority, added tenant") {
		t.Fatalf("the review: %s\n%s", resp.Status, body)
	}
	if d, w := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, topo.Queue); d != 10 || w != 0 {
		t.Fatalf("DLQ %d, work %d after the review", d, w)
	}
	// Back to the form, with what was typed.
	form.Set("confirm", "edit")
	if resp, body := c.post("/edit", form); resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="edit-form"`) || !strings.Contains(body, `&#34;customer&#34;:1014}</textarea>`) {
		t.Errorf("back to the form: %s\n%s", resp.Status, body)
	}
	form.Set("confirm", "yes")
	resp, body = c.post("/edit", form)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "replayed 1 edited, 0 left") {
		t.Fatalf("the edit: %s\n%s", resp.Status, body)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != 9 {
		t.Errorf("the DLQ holds %d, want 9", d)
	}
	d, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), topo.Queue)
	if !ok {
		t.Fatal("nothing on the work queue")
	}
	if string(d.Body) != `{"kind":"customer","n":2,"customer":1014}` || d.MessageId != "customer-2" || d.ContentType != "application/json" {
		t.Errorf("the copy: %s, %q, %q", d.Body, d.MessageId, d.ContentType)
	}
	h := d.Headers
	if h["tenant"] != "acme" || h["priority"] != int64(3) || h["x-amqpretry-edited-by"] != "alice" || h["x-amqpretry-edited-at"] == nil ||
		h["x-amqpretry-replayed"] != int64(1) || h["x-exception-message"] != nil {
		t.Errorf("the copy's headers: %v", h)
	}
	if nested, _ := h["nested"].(amqp.Table); nested == nil || len(nested["a"].([]any)) != 3 {
		t.Errorf("nested header: %#v", h["nested"])
	}
	var entry AuditEntry
	lines := strings.Split(strings.TrimSpace(s.audit.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &entry); err != nil {
		t.Fatal(err)
	}
	if entry.Action != "edit" || entry.Who != "alice" || entry.Done != 1 || entry.Edit == nil ||
		entry.Edit.OriginalBody != `{"kind":"customer","n":2}` || entry.Edit.OriginalBodyEncoding != "utf-8" ||
		entry.Edit.OriginalHeaders["x-exception-message"] != "customer 1014 not found" || entry.Edit.EditedHeaders["tenant"] != "acme" {
		t.Errorf("audit: %s", lines[len(lines)-1])
	}
}

// A body that is not UTF-8 can be replaced; the audit keeps it in base64.
// A form whose message has changed since is refused.
func TestEditBinaryBodyAndStaleForm(t *testing.T) {
	topo := topology(t)
	bin := []byte{0xff, 0xfe, 0x00, 0x01}
	brokertest.Publish(t, topo.DLQ(), amqp.Publishing{MessageId: "bin", ContentType: "application/octet-stream", Body: bin,
		Headers: amqp.Table{"x-amqpretry-original-queue": topo.Queue, "stamp": amqp.Decimal{Scale: 1, Value: 5}, "tenant": "acme"}})
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	_, _ = c.get("/")
	_, body := c.get("/edit?q=" + url.QueryEscape(topo.DLQ()) + "&k=id:bin")
	if !strings.Contains(body, "not UTF-8 text (4 bytes)") || !strings.Contains(body, "<code>stamp</code>") ||
		!strings.Contains(body, "&#34;tenant&#34;: &#34;acme&#34;") {
		t.Errorf("the form for a binary body:\n%s", body)
	}
	form := url.Values{"q": {topo.DLQ()}, "k": {"id:bin"}, "digest": {"0123"}, "body": {"text now"}, "headers": {"{}"}, "to": {"original"}, "confirm": {"yes"}}
	if resp, body := c.post("/edit", form); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "has changed since") {
		t.Errorf("a stale form: %s\n%s", resp.Status, body)
	}
	form.Set("digest", c.editDigest(topo.DLQ(), "id:bin"))
	if resp, body := c.post("/edit", form); !strings.Contains(body, "replayed 1 edited") {
		t.Fatalf("%s\n%s", resp.Status, body)
	}
	d, _ := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), topo.Queue)
	if string(d.Body) != "text now" || d.Headers["stamp"] == nil || d.Headers["tenant"] != nil {
		t.Errorf("the copy: %q %v", d.Body, d.Headers)
	}
	lines := strings.Split(strings.TrimSpace(s.audit.String()), "\n")
	var entry AuditEntry
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &entry); err != nil || entry.Edit == nil ||
		entry.Edit.OriginalBodyEncoding != "base64" || entry.Edit.OriginalBody != base64.StdEncoding.EncodeToString(bin) ||
		entry.Edit.OriginalHeaders["tenant"] != "acme" {
		t.Errorf("audit (%v): %s", err, lines[len(lines)-1])
	}
}

// Read-only refuses the form and the POST; a POST without the CSRF token,
// or from another origin, is refused as every action is.
func TestEditRefusals(t *testing.T) {
	topo := topology(t)
	fill(t, topo, threeKinds)
	ro := serve(t, Config{Queues: []string{topo.DLQ()}, ReadOnly: true}).signIn(t)
	_, _ = ro.get("/")
	if resp, _ := ro.get("/edit?q=" + url.QueryEscape(topo.DLQ()) + "&k=id:customer-1"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("read-only form: %s", resp.Status)
	}
	if _, body := ro.get("/message?q=" + url.QueryEscape(topo.DLQ()) + "&k=id:customer-1"); strings.Contains(body, "/edit?") {
		t.Errorf("the read-only message page links to the edit")
	}
	form := url.Values{"q": {topo.DLQ()}, "k": {"id:customer-1"}, "body": {"{}"}, "headers": {"{}"}, "confirm": {"yes"}}
	if resp, _ := ro.post("/edit", form); resp.StatusCode != http.StatusForbidden {
		t.Errorf("read-only POST: %s", resp.Status)
	}
	c := serve(t, Config{Queues: []string{topo.DLQ()}}).signIn(t)
	_, _ = c.get("/")
	form.Set("digest", c.editDigest(topo.DLQ(), "id:customer-1"))
	noToken := url.Values{"csrf": {"forged"}}
	for k, v := range form {
		noToken[k] = v
	}
	if resp, _ := c.post("/edit", noToken); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a POST without the CSRF token: %s", resp.Status)
	}
	c.fromPage = false
	req, _ := http.NewRequest(http.MethodPost, c.s.url+"/edit", strings.NewReader(form.Encode()+"&csrf="+url.QueryEscape(c.csrf())))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if resp, _ := c.do(req); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a cross-origin POST: %s", resp.Status)
	}
	if d, w := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, topo.Queue); d != 10 || w != 0 {
		t.Errorf("DLQ %d, work %d after the refusals", d, w)
	}
}

// A float JSON cannot carry (RabbitMQ 3.10 refuses to take one, other
// brokers and clients may not) is kept as it is by an edit, and written as
// text in the audit line.
func TestEditKeepsWhatJSONCannotCarry(t *testing.T) {
	h := amqp.Table{"ratio": math.NaN(), "big": math.Inf(1), "n": int64(3), "nested": amqp.Table{"x": math.NaN()}, "at": amqp.Decimal{Scale: 1, Value: 5}}
	editable, kept := appHeaders(h, "x-amqpretry-")
	if len(editable) != 1 || editable["n"] != int64(3) || len(kept) != 4 {
		t.Errorf("editable %v, kept %v", editable, kept)
	}
	line, err := json.Marshal(auditTable(h))
	if err != nil || !strings.Contains(string(line), `"ratio":"NaN"`) || !strings.Contains(string(line), `"nested":{"x":"NaN"}`) {
		t.Errorf("audit: %s, %v", line, err)
	}
}
