package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
)

func TestSearch(t *testing.T) {
	long := strings.Repeat("é", 60) + "NEEDLE" + strings.Repeat("x", 60)
	deliveries := []amqp.Delivery{
		{MessageId: "order-17"},
		{MessageId: "m2", CorrelationId: "corr-ABC"},
		{MessageId: "m3", Headers: amqp.Table{"tenant": "acme-42", "nested": amqp.Table{"k": "deep-value"}}},
		{MessageId: "m4", Headers: amqp.Table{"x-trace-flag": true}},
		{MessageId: "m5", Body: []byte(long)},
		{MessageId: "m6", Body: []byte("order-17 again, in the body")},
	}
	msgs := make([]*Message, len(deliveries))
	for i, d := range deliveries {
		msgs[i] = newMessage(d, i, "x-amqpretry-")
	}
	snap := &Snapshot{Queue: "q", Messages: msgs}
	for _, tt := range []struct {
		query string
		limit int
		want  []string // id: where
		total int
	}{
		{"order-17", 10, []string{"order-17: message id", "m6: body"}, 2},
		{"ORDER-17", 1, []string{"order-17: message id"}, 2},
		{"corr-abc", 10, []string{"m2: correlation id"}, 1},
		{"ACME", 10, []string{"m3: header tenant"}, 1},
		{"deep-value", 10, []string{"m3: header nested"}, 1},
		{"trace-flag", 10, []string{"m4: header x-trace-flag"}, 1},
		{"needle", 10, []string{"m5: body"}, 1},
		{"nothing like it", 10, nil, 0},
		{"", 10, nil, 0},
	} {
		hits, total := Search(snap, tt.query, tt.limit)
		var got []string
		for _, h := range hits {
			got = append(got, h.M.Delivery.MessageId+": "+h.Where)
		}
		if strings.Join(got, "|") != strings.Join(tt.want, "|") || total != tt.total {
			t.Errorf("Search(%q) = %v, %d in all; want %v, %d", tt.query, got, total, tt.want, tt.total)
		}
	}
	hits, _ := Search(snap, "needle", 10)
	h := hits[0]
	if h.Match != "NEEDLE" || h.Before != "…"+strings.Repeat("é", snippetContext) || h.After != strings.Repeat("x", snippetContext)+"…" {
		t.Errorf("snippet %q %q %q", h.Before, h.Match, h.After)
	}
}

// The search page finds a message among the console's queues, links to it,
// and shows hostile text inert; a search that is too long is refused.
func TestSearchPage(t *testing.T) {
	topo := topology(t)
	fill(t, topo, threeKinds)
	brokertest.Publish(t, topo.DLQ(), amqp.Publishing{MessageId: "evil", Body: []byte(`pay <script>alert(1)</script> now`)})
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	resp, body := c.get("/search?s=" + url.QueryEscape("<SCRIPT>alert"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("search: %s\n%s", resp.Status, body)
	}
	if strings.Contains(body, "<script>") || !strings.Contains(body, "<mark>&lt;script&gt;alert</mark>") {
		t.Errorf("the hit is not shown escaped:\n%s", body)
	}
	if !strings.Contains(body, `&amp;k=id%3aevil">evil</a>`) {
		t.Errorf("no link to the message:\n%s", body)
	}
	if !strings.Contains(body, "1 message holds") {
		t.Errorf("the count is wrong:\n%s", body)
	}
	_, body = c.get("/search?s=" + strings.Repeat("x", maxQuery+1))
	if !strings.Contains(body, "at most 200 characters") {
		t.Errorf("a long search:\n%s", body)
	}
	// The box is on every page.
	for _, path := range []string{"/", "/search"} {
		if _, body := c.get(path); !strings.Contains(body, `<form method="get" action="/search" class="search"`) {
			t.Errorf("%s has no search box", path)
		}
	}
}
