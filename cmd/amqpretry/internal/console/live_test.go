package console

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
)

var metaRefresh = regexp.MustCompile(`<meta http-equiv="refresh" content="([0-9]+)">`)

// The overview reloads itself only when asked, within bounds, and says how
// many dead letters arrived since its snapshot.
func TestOverviewLive(t *testing.T) {
	topo := topology(t)
	fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	for _, tt := range []struct{ query, want string }{
		{"", ""}, {"?refresh=10", "10"}, {"?refresh=1", "5"}, {"?refresh=999999", "3600"},
		{"?refresh=-3", ""}, {"?refresh=abc", ""}, {"?refresh=0", ""}, {"?by=stack&refresh=30", "30"},
	} {
		_, body := c.get("/" + tt.query)
		got := ""
		if m := metaRefresh.FindStringSubmatch(body); m != nil {
			got = m[1]
		}
		if got != tt.want {
			t.Errorf("/%s reloads every %q s, want %q", tt.query, got, tt.want)
		}
	}
	_, body := c.get("/")
	if strings.Contains(body, "arrived since the snapshot") {
		t.Errorf("arrivals before any arrived:\n%s", body)
	}
	for i := range 3 {
		brokertest.Publish(t, topo.DLQ(), amqp.Publishing{MessageId: fmt.Sprintf("late-%d", i)})
	}
	_, body = c.get("/")
	if !strings.Contains(body, "<strong>3 dead letters arrived since the snapshot</strong>") || !strings.Contains(body, "10 of 10 messages") {
		t.Errorf("the overview does not say 3 arrived:\n%s", body)
	}
}
