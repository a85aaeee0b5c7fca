package console

import (
	"context"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/pubtest"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/recoverer"
)

// deadLetter puts one dead letter with message id id on topo's DLQ, as
// topo's recoverer writes it after cause; edit, if not nil, changes the
// message first.
func deadLetter(t testing.TB, topo dlx.Topology, id string, cause error, edit func(*amqp.Publishing)) {
	t.Helper()
	d := amqp.Delivery{MessageId: id, RoutingKey: topo.Queue, ContentType: "application/json", Body: []byte(fmt.Sprintf(`{"id":%q}`, id))}
	republish(t, topo, &d, cause, edit)
}

// republish publishes to topo's DLQ what topo's recoverer makes of d after
// cause, confirmed.
func republish(t testing.TB, topo dlx.Topology, d *amqp.Delivery, cause error, edit func(*amqp.Publishing)) {
	t.Helper()
	rep := recoverer.Republish(&pubtest.Publisher{}, topo.DLX(), topo.DLQRoutingKey())
	msg, err := rep.Message(chainrun.WithQueue(context.Background(), topo.Queue), d, cause)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&msg)
	}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	conf, err := ch.PublishWithDeferredConfirm(topo.DLX(), topo.DLQRoutingKey(), true, false, msg)
	if err != nil {
		t.Fatal(err)
	}
	waitConfirms(t, []*amqp.DeferredConfirmation{conf})
}

var (
	confirmForm  = regexp.MustCompile(`(?s)<form method="post" action="/act" class="actions"(?: id="confirm-form")?>(.*?)</form>`)
	hiddenInput  = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
	submitButton = regexp.MustCompile(`<button name="op" value="([^"]+)"`)
)

// confirmation reads the form of a confirmation page, as a browser would
// submit it; nil if body has none.
func confirmation(body string) url.Values {
	m := confirmForm.FindStringSubmatch(body)
	if m == nil {
		return nil
	}
	form := url.Values{}
	for _, in := range hiddenInput.FindAllStringSubmatch(m[1], -1) {
		form.Add(html.UnescapeString(in[1]), html.UnescapeString(in[2]))
	}
	if b := submitButton.FindStringSubmatch(m[1]); b != nil {
		form.Set("op", html.UnescapeString(b[1]))
	}
	return form
}

// groupIDs reads the overview's group ids by signature.
func groupIDs(t testing.TB, c *client) map[string]string {
	t.Helper()
	_, body := c.get("/")
	_, ids := overviewGroups(t, body)
	return ids
}

const customerGroup = "customer &lt;n&gt; not found"

// Two dead letters of different causes that share a message id (a business
// key): an action on one's group takes that one, never the other group's —
// a delete of the group, a replay of the group, a replay of the message
// ticked on the group's page (issue 34, item 10).
func TestGroupActionTakesOnlyItsGroup(t *testing.T) {
	tax := fmt.Errorf("tax service: request 0a1b2c3d-1d2e-4f3a-8b9c-0123456789ab timed out after 3000ms: %w", context.DeadlineExceeded)
	for _, tc := range []struct {
		name string
		form func(group string) url.Values
		want string
	}{
		{"DeleteGroup", func(g string) url.Values { return url.Values{"g": {g}, "op": {"delete-group"}} }, "archived 2 to "},
		{"ReplayGroup", func(g string) url.Values { return url.Values{"g": {g}, "op": {"replay-group"}} }, "replayed 2, 0 left"},
		{"ReplayTicked", func(g string) url.Values {
			return url.Values{"g": {g}, "k": {"id:order-17", "id:order-18"}, "op": {"replay-selected"}}
		}, "replayed 2, 0 left"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := topology(t)
			// The tax failure of order-17 first: an action that matches by
			// id alone takes it before the customer one.
			deadLetter(t, topo, "order-17", tax, nil)
			deadLetter(t, topo, "order-17", errors.New("customer 1042 not found"), nil)
			deadLetter(t, topo, "order-18", errors.New("customer 7 not found"), nil)
			s := serve(t, Config{Queues: []string{topo.DLQ()}})
			c := s.signIn(t)
			form := tc.form(groupIDs(t, c)[customerGroup])
			form.Set("q", topo.DLQ())
			resp, body := c.post("/act", form)
			if again := confirmation(body); again != nil {
				resp, body = c.post("/act", again)
			}
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, tc.want) {
				t.Fatalf("%s: %s\n%s", tc.name, resp.Status, body)
			}
			ch := brokertest.Channel(t, brokertest.Dial(t))
			m, ok := brokertest.Get(t, ch, topo.DLQ())
			if exc, _ := m.Headers[recoverer.HeaderExceptionMessage].(string); !ok || m.MessageId != "order-17" || !strings.HasPrefix(exc, "tax service") {
				t.Errorf("left on the DLQ: %q failed with %q (ok %v), want order-17's tax failure", m.MessageId, exc, ok)
			}
			if d := brokertest.Depth(t, topo.DLQ()); d != 0 {
				t.Errorf("%d more left on the DLQ, want none", d)
			}
			// The snapshot forgets the customer ones, not the tax one.
			_, body = c.get("/")
			body, _, _ = strings.Cut(body, "<h2>"+ArchiveOf(topo.DLQ())) // the archive's groups follow
			if counts, _ := overviewGroups(t, body); len(counts) != 1 || counts[customerGroup] != 0 {
				t.Errorf("after the action the overview shows %v, want the tax group alone", counts)
			}
		})
	}
}

// A confirmed delete of a group takes what the confirmation listed: when a
// later look found more of the group, it refuses and asks again with the
// new count, and the new confirmation does it (issue 34, item 11).
func TestConfirmedDeleteRefusesWhatChanged(t *testing.T) {
	topo := topology(t)
	fill(t, topo, []failure{{"customer", 3, threeKinds[0].cause}})
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	id := groupIDs(t, c)[customerGroup]
	_, body := c.post("/act", url.Values{"q": {topo.DLQ()}, "g": {id}, "op": {"delete-group"}})
	confirm := confirmation(body)
	if confirm == nil || !strings.Contains(body, "Delete (archive) 3 messages from") {
		t.Fatalf("no confirmation of 3:\n%s", body)
	}
	fill(t, topo, []failure{{"customer-later", 2, threeKinds[0].cause}})
	if resp, body := c.post("/look", url.Values{"q": {topo.DLQ()}}); resp.StatusCode != http.StatusOK {
		t.Fatalf("look: %s\n%s", resp.Status, body)
	}
	resp, body := c.post("/act", confirm)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "Delete (archive) 5 messages from") || confirmation(body) == nil {
		t.Fatalf("the stale confirmation: %s, want 409 and a fresh confirmation of 5\n%s", resp.Status, body)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != 5 {
		t.Fatalf("the stale confirmation left %d on the DLQ, want 5", d)
	}
	_, body = c.post("/act", confirmation(body))
	if !strings.Contains(body, "archived 5 to ") || brokertest.Depth(t, topo.DLQ()) != 0 {
		t.Fatalf("the fresh confirmation:\n%s", body)
	}
}

// A confirmed delete of ticked messages takes as many as it listed: a later
// look that found another message with one of their ids makes it ask again.
func TestConfirmedDeleteOfTickedRefusesWhatChanged(t *testing.T) {
	topo := topology(t)
	deadLetter(t, topo, "order-17", errors.New("customer 1042 not found"), nil)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	id := groupIDs(t, c)[customerGroup]
	_, body := c.post("/act", url.Values{"q": {topo.DLQ()}, "g": {id}, "k": {"id:order-17"}, "op": {"delete-selected"}})
	confirm := confirmation(body)
	if confirm == nil || !strings.Contains(body, "Delete (archive) 1 message from") {
		t.Fatalf("no confirmation of 1:\n%s", body)
	}
	deadLetter(t, topo, "order-17", errors.New("customer 1042 not found"), nil)
	c.post("/look", url.Values{"q": {topo.DLQ()}})
	resp, body := c.post("/act", confirm)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "Delete (archive) 2 messages from") {
		t.Fatalf("the stale confirmation: %s, want 409 and a fresh confirmation of 2\n%s", resp.Status, body)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != 2 {
		t.Fatalf("the stale confirmation left %d on the DLQ, want 2", d)
	}
}

// "Replay all N" asks first, with the count, and like a delete refuses a
// confirmation of a group that has changed since (issue 34, item 11; issue
// 40, item 6).
func TestReplayAllConfirmsWhatItListed(t *testing.T) {
	topo := topology(t)
	fill(t, topo, []failure{{"customer", 3, threeKinds[0].cause}})
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	id := groupIDs(t, c)[customerGroup]
	_, page := c.get("/group?q=" + url.QueryEscape(topo.DLQ()) + "&g=" + id)
	if !strings.Contains(page, `name="listed"`) {
		t.Errorf("the group page's form does not carry what it lists:\n%s", page)
	}
	resp, body := c.post("/act", url.Values{"q": {topo.DLQ()}, "g": {id}, "op": {"replay-group"}, "to": {"original"}})
	confirm := confirmation(body)
	if resp.StatusCode != http.StatusOK || confirm == nil || !strings.Contains(body, "Replay 3 messages from") {
		t.Fatalf("Replay all without a confirmation: %s\n%s", resp.Status, body)
	}
	if w, d := brokertest.Depth(t, topo.Queue), brokertest.Depth(t, topo.DLQ()); w != 0 || d != 3 {
		t.Fatalf("before the confirmation: work queue %d, DLQ %d; want 0 and 3", w, d)
	}
	fill(t, topo, []failure{{"customer-later", 2, threeKinds[0].cause}})
	c.post("/look", url.Values{"q": {topo.DLQ()}})
	resp, body = c.post("/act", confirm)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "Replay 5 messages from") {
		t.Fatalf("the stale confirmation: %s, want 409 and a fresh one of 5\n%s", resp.Status, body)
	}
	if w := brokertest.Depth(t, topo.Queue); w != 0 {
		t.Fatalf("the stale confirmation replayed %d", w)
	}
	_, body = c.post("/act", confirmation(body))
	if !strings.Contains(body, "replayed 5, 0 left") || brokertest.Depth(t, topo.Queue) != 5 {
		t.Fatalf("the fresh confirmation:\n%s", body)
	}
}

// A replayed message keeps its history: how often it was replayed and what
// it failed with before, so that when it fails again the message page says
// so (issue 40, item 6).
func TestReplayKeepsHistory(t *testing.T) {
	topo := topology(t)
	deadLetter(t, topo, "order-17", errors.New("customer 1042 not found"), nil)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for round := 1; round <= 2; round++ {
		c.post("/look", url.Values{"q": {topo.DLQ()}})
		_, body := c.post("/act", url.Values{"q": {topo.DLQ()}, "k": {"id:order-17"}, "op": {"replay-selected"}})
		if !strings.Contains(body, "replayed 1, 0 left") {
			t.Fatalf("round %d: replay:\n%s", round, body)
		}
		d, ok := brokertest.Get(t, ch, topo.Queue)
		if !ok {
			t.Fatalf("round %d: nothing on the work queue", round)
		}
		prefix := recoverer.DefaultHeaderPrefix
		if n, _ := d.Headers[prefix+dlx.SuffixReplayed].(int64); n != int64(round) {
			t.Errorf("round %d: %s is %v, want %d", round, prefix+dlx.SuffixReplayed, d.Headers[prefix+dlx.SuffixReplayed], round)
		}
		before := "customer 1042 not found"
		if round == 2 {
			before = "customer 1042 still not found"
		}
		if exc := d.Headers[prefix+dlx.SuffixPreviousException]; exc != before {
			t.Errorf("round %d: %s is %v, want %q", round, prefix+dlx.SuffixPreviousException, exc, before)
		}
		if _, ok := d.Headers[recoverer.HeaderExceptionMessage]; ok {
			t.Errorf("round %d: the replayed message still carries its exception", round)
		}
		// It fails again.
		republish(t, topo, &d, errors.New("customer 1042 still not found"), nil)
		c.post("/look", url.Values{"q": {topo.DLQ()}})
		_, body = c.get("/message?q=" + url.QueryEscape(topo.DLQ()) + "&k=id:order-17")
		if !strings.Contains(body, fmt.Sprintf(`<dd id="replayed">%d</dd>`, round)) || !strings.Contains(body, "<pre class=\"exc\" id=\"previous-exception\">"+before+"</pre>") {
			t.Errorf("round %d: the message page does not show the replay and the failure before it:\n%s", round, body)
		}
	}
}

// A stack trace shows with its tabs, not as \t (issue 40, item 7).
func TestStackTraceKeepsTabs(t *testing.T) {
	topo := topology(t)
	const stack = "panic: boom\n\ngoroutine 7 [running]:\nmain.handle()\n\t/src/orders/main.go:42 +0x1d\n"
	deadLetter(t, topo, "order-17", errors.New("boom"), func(m *amqp.Publishing) {
		m.Headers[recoverer.HeaderExceptionStacktrace] = stack
	})
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	_, body := c.get("/message?q=" + url.QueryEscape(topo.DLQ()) + "&k=id:order-17")
	if !strings.Contains(body, "main.handle()\n\t/src/orders/main.go:42 ") || strings.Contains(body, `\t/src`) {
		t.Errorf("the message page shows the stack without its tabs:\n%s", body)
	}
	_, body = c.get("/?by=stack")
	_, ids := overviewGroups(t, body)
	for _, id := range ids {
		_, body = c.get("/group?q=" + url.QueryEscape(topo.DLQ()) + "&g=" + id + "&by=stack")
		if !strings.Contains(body, "\t/src/orders/main.go:") || strings.Contains(body, `\t/src`) {
			t.Errorf("the group page shows the stack without its tabs:\n%s", body)
		}
	}
}

// "Delete all N…" on a group's page that a later look has changed asks
// about what the group holds now, and says that it changed.
func TestGroupPageSaysWhatChanged(t *testing.T) {
	topo := topology(t)
	fill(t, topo, []failure{{"customer", 3, threeKinds[0].cause}})
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	id := groupIDs(t, c)[customerGroup]
	_, page := c.get("/group?q=" + url.QueryEscape(topo.DLQ()) + "&g=" + id)
	m := regexp.MustCompile(`name="listed" value="([0-9a-f]+)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("the group page's form does not carry what it lists:\n%s", page)
	}
	fill(t, topo, []failure{{"customer-later", 2, threeKinds[0].cause}})
	c.post("/look", url.Values{"q": {topo.DLQ()}})
	resp, body := c.post("/act", url.Values{"q": {topo.DLQ()}, "g": {id}, "op": {"delete-group"}, "listed": {m[1]}, "n": {"3"}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Delete (archive) 5 messages from") || !strings.Contains(body, "(3 then, 5 now)") {
		t.Fatalf("a delete from a page that listed 3: %s\n%s", resp.Status, body)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != 5 {
		t.Fatalf("the DLQ holds %d before any confirmation, want 5", d)
	}
}
