package console

import (
	"net/http"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// A dead letter whose headers amqp091-go cannot parse (nested 33 deep, as
// pika can send) does not stop the console: the look goes on past it, the
// other groups show, and the broker keeps the message as it was sent.
func TestLookCarriesOnPastAnUnreadableDeadLetter(t *testing.T) {
	topo := topology(t)
	n := fill(t, topo, threeKinds)
	brokertest.Publish(t, topo.DLQ(), amqp.Publishing{MessageId: "from-pika", Headers: amqp.Table{"deep": brokertest.HeadersTooDeep()}})
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	resp, body := c.get("/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("overview: %s\n%s", resp.Status, body)
	}
	counts, _ := overviewGroups(t, body)
	if counts["customer &lt;n&gt; not found"] != 5 {
		t.Errorf("groups %v: the look stopped at the unreadable message", counts)
	}
	if !strings.Contains(body, "11 of 11 messages") {
		t.Errorf("the overview does not count the unreadable message in its snapshot:\n%s", body)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != n+1 {
		t.Errorf("after a look the DLQ holds %d ready messages, want %d", d, n+1)
	}
}
