package console

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/recoverer"
)

// Delete moves the ticked dead letters to the DLQ's archive with every
// header (x-death, the fault headers) plus when, by whom and from where;
// nothing is lost (DLQ + archive counts); the archive shows on the
// overview, and Restore on its page puts them back without the archive's
// headers.
func TestDeleteArchivesAndRestoreBringsBack(t *testing.T) {
	topo := topology(t)
	xdeath := func(p *amqp.Publishing) {
		p.Headers["x-death"] = []any{amqp.Table{"queue": topo.Queue, "reason": "rejected", "count": int64(2), "exchange": "", "routing-keys": []any{topo.Queue}}}
	}
	for _, id := range []string{"order-1", "order-2", "order-3"} {
		deadLetter(t, topo, id, errors.New("customer 7 not found"), xdeath)
	}
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	group := groupIDs(t, c)["customer &lt;n&gt; not found"]
	resp, body := c.post("/act", url.Values{"q": {topo.DLQ()}, "g": {group}, "k": {"id:order-1", "id:order-2"}, "op": {"delete-selected"}})
	if again := confirmation(body); again != nil {
		resp, body = c.post("/act", again)
	}
	archive := ArchiveOf(topo.DLQ())
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "archived 2 to "+archive) {
		t.Fatalf("delete: %s\n%s", resp.Status, body)
	}
	if d, a := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, archive); d != 1 || a != 2 {
		t.Fatalf("the DLQ holds %d, the archive %d; want 1 and 2", d, a)
	}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	m, ok, err := ch.Get(archive, false)
	if err != nil || !ok {
		t.Fatalf("nothing on the archive: %v", err)
	}
	for _, k := range []string{"x-death", recoverer.HeaderExceptionMessage, s.prefix + recoverer.SuffixOriginalQueue,
		s.prefix + SuffixArchivedAt, s.prefix + SuffixArchivedFrom} {
		if _, ok := m.Headers[k]; !ok {
			t.Errorf("the archived copy lacks %s: %v", k, m.Headers)
		}
	}
	if by, _ := m.Headers[s.prefix+SuffixArchivedBy].(string); by == "" || m.Headers[s.prefix+SuffixArchivedFrom] != topo.DLQ() {
		t.Errorf("archived by %q from %v", by, m.Headers[s.prefix+SuffixArchivedFrom])
	}
	_ = m.Nack(false, true)
	brokertest.Eventually(t, 5e9, "the look handed back", func() bool { return brokertest.Depth(t, archive) == 2 })

	_, body = c.get("/")
	if !strings.Contains(body, archive) {
		t.Fatalf("the overview does not show the archive:\n%s", body)
	}
	ids := archiveGroup(t, c, archive)
	resp, body = c.post("/act", url.Values{"q": {archive}, "g": {ids}, "op": {"restore-group"}})
	if again := confirmation(body); again != nil {
		resp, body = c.post("/act", again)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "restored 2") {
		t.Fatalf("restore: %s\n%s", resp.Status, body)
	}
	if d, a := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, archive); d != 3 || a != 0 {
		t.Fatalf("after restore the DLQ holds %d, the archive %d; want 3 and 0", d, a)
	}
	for range 3 {
		m, _ := brokertest.Get(t, ch, topo.DLQ())
		if _, ok := m.Headers["x-death"]; !ok || m.Headers[recoverer.HeaderExceptionMessage] == nil {
			t.Errorf("%s came back without its x-death or exception: %v", m.MessageId, m.Headers)
		}
		for _, sfx := range []string{SuffixArchivedAt, SuffixArchivedBy, SuffixArchivedFrom} {
			if _, ok := m.Headers[s.prefix+sfx]; ok {
				t.Errorf("%s kept %s", m.MessageId, sfx)
			}
		}
	}
}

// archiveGroup is the id of the one group on archive's section of the
// overview.
func archiveGroup(t *testing.T, c *client, archive string) string {
	t.Helper()
	_, body := c.get("/")
	i := strings.Index(body, "/group?q="+url.QueryEscape(archive)+"&amp;g=")
	if i < 0 {
		i = strings.Index(body, "/group?q="+archive+"&amp;g=")
	}
	if i < 0 {
		t.Fatalf("no group of %s on the overview:\n%s", archive, body)
	}
	rest := body[i:]
	rest = rest[strings.Index(rest, "g=")+2:]
	return rest[:strings.IndexAny(rest, "&\"")]
}

// A copy the archive refuses (a conflicting declaration: full, rejecting
// publishes, so the broker nacks it) leaves the message on the DLQ.
func TestDeleteThatCannotArchiveKeepsTheMessage(t *testing.T) {
	topo := topology(t)
	deadLetter(t, topo, "order-1", errors.New("customer 7 not found"), nil)
	brokertest.Queue(t, ArchiveOf(topo.DLQ()), amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	snap, err := s.Snapshot(context.Background(), topo.DLQ(), true)
	if err != nil {
		t.Fatal(err)
	}
	out := s.Delete(context.Background(), topo.DLQ(), TickedSelection(snap, nil, []string{"id:order-1"}), "tester")
	if out.Err == nil || out.Done != 0 {
		t.Fatalf("a delete the archive refused: %+v", out)
	}
	if d, a := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, ArchiveOf(topo.DLQ())); d != 1 || a != 0 {
		t.Errorf("the DLQ holds %d, the archive %d; want the message still on the DLQ", d, a)
	}
}
