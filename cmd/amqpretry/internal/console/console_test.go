package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// The overview groups the dead letters of a DLQ by cause, with the right
// counts, and looking leaves every message on the queue, ready.
func TestOverviewGroupsByCause(t *testing.T) {
	topo := topology(t)
	n := fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	resp, body := c.get("/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("overview: %s\n%s", resp.Status, body)
	}
	counts, _ := overviewGroups(t, body)
	want := map[string]int{
		"customer &lt;n&gt; not found": 5,
		"tax service: request &lt;uuid&gt; timed out after &lt;n&gt;ms: context deadline exceeded":           3,
		`bad field &lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt; \u202egnp.exe item &lt;n&gt;`: 2,
	}
	if len(counts) != len(want) {
		t.Fatalf("groups %v, want %v\n%s", counts, want, body)
	}
	for sig, n := range want {
		if counts[sig] != n {
			t.Errorf("group %q: %d, want %d (all: %v)", sig, counts[sig], n, counts)
		}
	}
	if !strings.Contains(body, "10 of 10 messages") {
		t.Errorf("the overview does not say what the snapshot holds:\n%s", body)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != n {
		t.Errorf("after a look the DLQ holds %d ready messages, want %d", d, n)
	}
	// By stack: the error chains differ by type, so still three groups.
	_, body = c.get("/?by=stack")
	if counts, _ := overviewGroups(t, body); len(counts) != 3 {
		t.Errorf("by stack: %d groups, want 3: %v", len(counts), counts)
	}
}

// Replaying a group puts exactly its messages back on the work queue; the
// page and the audit log say what was done.
func TestReplayGroup(t *testing.T) {
	topo := topology(t)
	fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	_, body := c.get("/")
	_, ids := overviewGroups(t, body)
	id := ids["customer &lt;n&gt; not found"]
	if id == "" {
		t.Fatalf("no customer group on the overview:\n%s", body)
	}
	_, body = c.post("/act", url.Values{"q": {topo.DLQ()}, "g": {id}, "op": {"replay-group"}, "to": {"original"}})
	resp, body := c.post("/act", confirmation(body))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "replayed 5, 0 left") {
		t.Fatalf("replay: %s\n%s", resp.Status, body)
	}
	if w, d := brokertest.Depth(t, topo.Queue), brokertest.Depth(t, topo.DLQ()); w != 5 || d != 5 {
		t.Fatalf("work queue %d, DLQ %d: want 5 and 5", w, d)
	}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for range 5 {
		m, _ := brokertest.Get(t, ch, topo.Queue)
		if !strings.HasPrefix(m.MessageId, "customer-") || m.Headers["x-exception-message"] != nil {
			t.Errorf("replayed %q with headers %v: want a customer message without fault headers", m.MessageId, m.Headers)
		}
	}
	var entry AuditEntry
	if err := json.Unmarshal([]byte(strings.TrimSpace(s.audit.String())), &entry); err != nil {
		t.Fatalf("audit log %q: %v", s.audit.String(), err)
	}
	if entry.Who != "alice" || entry.Action != "replay" || entry.Queue != topo.DLQ() || entry.Done != 5 || entry.Left != 0 ||
		entry.Outcome != "ok" || len(entry.Messages) != 5 || entry.Messages[0] != "id:customer-0" || entry.Time.IsZero() {
		t.Errorf("audit line: %+v", entry)
	}
	// The overview no longer shows the group, without a new look.
	_, body = c.get("/")
	if counts, _ := overviewGroups(t, body); len(counts) != 2 {
		t.Errorf("after the replay: groups %v, want 2", counts)
	}
}

// Actions are keyed by message id: messages that reached the DLQ after the
// look, though of the same cause, stay.
func TestReplayActsOnWhatWasShown(t *testing.T) {
	topo := topology(t)
	fill(t, topo, threeKinds[:1])
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	_, body := c.get("/")
	_, ids := overviewGroups(t, body)
	later := failure{"customer-later", 4, threeKinds[0].cause}
	fill(t, topo, []failure{later})
	_, body = c.post("/act", url.Values{"q": {topo.DLQ()}, "g": {ids["customer &lt;n&gt; not found"]}, "op": {"replay-group"}})
	_, body = c.post("/act", confirmation(body))
	if !strings.Contains(body, "replayed 5, 0 left") {
		t.Fatalf("replay:\n%s", body)
	}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for range 4 {
		if m, ok := brokertest.Get(t, ch, topo.DLQ()); !ok || !strings.HasPrefix(m.MessageId, "customer-later-") {
			t.Errorf("left on the DLQ: %q (ok %v), want the later ones", m.MessageId, ok)
		}
	}
}

// A replay of one ticked message takes that one only, to a chosen queue.
func TestReplaySelectedToAQueue(t *testing.T) {
	topo := topology(t)
	fill(t, topo, threeKinds)
	other := brokertest.Name(t, "other")
	brokertest.Queue(t, other, nil)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	c.get("/")
	_, body := c.post("/act", url.Values{"q": {topo.DLQ()}, "k": {"id:tax-1", "id:customer-4"}, "op": {"replay-selected"},
		"to": {"queue"}, "to_queue": {other}})
	if !strings.Contains(body, "replayed 2, 0 left") {
		t.Fatalf("replay:\n%s", body)
	}
	if n := brokertest.Depth(t, other); n != 2 {
		t.Errorf("%s holds %d, want 2", other, n)
	}
}

// A delete asks first; only the confirmed form deletes.
func TestDeleteAsksFirst(t *testing.T) {
	topo := topology(t)
	n := fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	_, body := c.get("/")
	_, ids := overviewGroups(t, body)
	id := ids["customer &lt;n&gt; not found"]
	resp, body := c.post("/act", url.Values{"q": {topo.DLQ()}, "g": {id}, "op": {"delete-group"}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Delete (archive) 5 messages from") || !strings.Contains(body, `name="confirm" value="yes"`) {
		t.Fatalf("delete without confirm: %s\n%s", resp.Status, body)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != n {
		t.Fatalf("the DLQ holds %d before the confirmation, want %d", d, n)
	}
	// A confirmation that does not carry what it listed is refused.
	resp, body = c.post("/act", url.Values{"q": {topo.DLQ()}, "g": {id}, "op": {"delete-group"}, "confirm": {"yes"}})
	if resp.StatusCode != http.StatusConflict || confirmation(body) == nil || brokertest.Depth(t, topo.DLQ()) != n {
		t.Fatalf("a confirmation without what it listed: %s\n%s", resp.Status, body)
	}
	_, body = c.post("/act", confirmation(body))
	if !strings.Contains(body, "archived 5 to ") {
		t.Fatalf("confirmed delete:\n%s", body)
	}
	if d, w := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, topo.Queue); d != n-5 || w != 0 {
		t.Errorf("DLQ %d, work %d: want %d and 0", d, w, n-5)
	}
	if !strings.Contains(s.audit.String(), `"action":"delete"`) {
		t.Errorf("audit: %s", s.audit.String())
	}
}

// A purge needs the queue's name typed out.
func TestPurgeNeedsTheName(t *testing.T) {
	topo := topology(t)
	n := fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	c.get("/")
	for _, typed := range []string{"", "yes", topo.Queue} {
		resp, body := c.post("/purge", url.Values{"q": {topo.DLQ()}, "name": {typed}})
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "Nothing was purged") {
			t.Errorf("purge with %q typed: %s\n%s", typed, resp.Status, body)
		}
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != n {
		t.Fatalf("the DLQ holds %d, want %d", d, n)
	}
	_, body := c.post("/purge", url.Values{"q": {topo.DLQ()}, "name": {topo.DLQ()}})
	if !strings.Contains(body, "purged 10") {
		t.Fatalf("purge:\n%s", body)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != 0 {
		t.Errorf("the DLQ holds %d after the purge", d)
	}
}

// One look or action at a time per queue: a look asked for while another
// holds the queue waits, taking nothing.
func TestOneLookAtATime(t *testing.T) {
	topo := topology(t)
	n := fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	unlock, err := s.lock(t.Context(), topo.DLQ())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Snapshot(t.Context(), topo.DLQ(), true)
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("a look ran while the queue was held: %v", err)
	default:
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != n {
		t.Fatalf("%d ready while the look waits, want %d", d, n)
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A look right after another, or a replay right after a look, finds every
// message back: a classic queue reports its count before it has put back
// the messages a look handed back, and a look or replay that trusted that
// count would stop short.
func TestLookAfterLookFindsEverything(t *testing.T) {
	topo := topology(t)
	n := fill(t, topo, []failure{{"customer", 1000, threeKinds[0].cause}})
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	for i := range 2 {
		snap, err := s.Snapshot(t.Context(), topo.DLQ(), true)
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Messages) != n || snap.Depth != n {
			t.Fatalf("look %d took %d of %d, want %d of %d", i, len(snap.Messages), snap.Depth, n, n)
		}
	}
	// The last message of the queue: a replay that scanned only what the
	// count said would not reach it.
	last := map[string]int{fmt.Sprintf("id:customer-%d", n-1): 1}
	if out := s.Replay(t.Context(), topo.DLQ(), Selection{Keys: last}, Destination{}); out.Err != nil || out.Done != 1 || out.Missing != 0 || out.Depth != n-1 {
		t.Fatalf("a replay right after the looks: %+v", out)
	}
}

// A message the broker dead-lettered itself (rejected without requeue, no
// recoverer) is grouped by the queue and reason its x-death names, and its
// page shows the x-death entry; it replays to that queue.
func TestBrokerDeadLetteredMessage(t *testing.T) {
	topo := topology(t)
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "rejected-1", Body: []byte("plain")})
	ch := brokertest.Channel(t, brokertest.Dial(t))
	d, ok, err := ch.Get(topo.Queue, false)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if err := d.Reject(false); err != nil {
		t.Fatal(err)
	}
	brokertest.Eventually(t, 10*time.Second, "the rejected message on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	_, body := c.get("/")
	if !strings.Contains(body, "<td>dead-lettered by the broker: rejected</td>") || !strings.Contains(body, "<td>"+topo.Queue+"</td>") {
		t.Errorf("the overview does not group it by its x-death:\n%s", body)
	}
	_, body = c.get("/message?q=" + url.QueryEscape(topo.DLQ()) + "&k=id:rejected-1&view=text")
	if !strings.Contains(body, `<table class="deaths">`) || !strings.Contains(body, "<td>"+topo.Queue+"</td><td>rejected</td><td class=\"n\">1</td>") ||
		!strings.Contains(body, `<pre class="body" id="body">plain</pre>`) {
		t.Errorf("the message page:\n%s", body)
	}
	_, body = c.post("/act", url.Values{"q": {topo.DLQ()}, "k": {"id:rejected-1"}, "op": {"replay-selected"}})
	if !strings.Contains(body, "replayed 1, 0 left") || brokertest.Depth(t, topo.Queue) != 1 {
		t.Errorf("replay to the queue of its x-death:\n%s", body)
	}
}

// A replay to the original exchange publishes with the exchange and routing
// key the message was first published with; a ticked message is deleted
// after its confirmation.
func TestReplayToExchangeAndDeleteSelected(t *testing.T) {
	topo := topology(t)
	n := fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	c.get("/")
	// The dead letters were first published to the default exchange with
	// the work queue's name as routing key.
	_, body := c.post("/act", url.Values{"q": {topo.DLQ()}, "k": {"id:customer-0"}, "op": {"replay-selected"}, "to": {"exchange"}})
	if !strings.Contains(body, "replayed 1, 0 left") || !strings.Contains(body, "their original exchange and routing key") {
		t.Fatalf("replay to the exchange:\n%s", body)
	}
	if w := brokertest.Depth(t, topo.Queue); w != 1 {
		t.Errorf("work queue %d, want 1", w)
	}
	_, body = c.post("/act", url.Values{"q": {topo.DLQ()}, "k": {"id:tax-2", "id:hostile-1"}, "op": {"delete-selected"}})
	if !strings.Contains(body, "Delete (archive) 2 messages from") || !strings.Contains(body, `name="k" value="id:tax-2"`) {
		t.Fatalf("delete of ticked messages without a confirmation:\n%s", body)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != n-1 {
		t.Fatalf("the DLQ holds %d before the confirmation", d)
	}
	_, body = c.post("/act", confirmation(body))
	if !strings.Contains(body, "archived 2 to ") || brokertest.Depth(t, topo.DLQ()) != n-3 {
		t.Errorf("confirmed delete of ticked messages:\n%s", body)
	}
	// A key no longer on the queue: nothing done, and said so.
	_, body = c.post("/act", url.Values{"q": {topo.DLQ()}, "k": {"id:tax-2"}, "op": {"delete-selected"}})
	_, body = c.post("/act", confirmation(body))
	if !strings.Contains(body, "archived 0 to ") || !strings.Contains(body, "0 left on") || !strings.Contains(body, "1 no longer on the queue") {
		t.Errorf("delete of a message already gone:\n%s", body)
	}
}
