package main

import (
	"fmt"
	"testing"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// A quorum DLQ declared without x-delivery-limit keeps the broker's default
// (20 on RabbitMQ 4.x). dlq list and dlq show look at it many times: from
// 4.3 a look hands every message back with a nack the broker has applied
// before the channel closes, so no look counts and none of the dead letters
// is lost; 3.10 and 4.0 count every hand-back, once per look that took the
// message (issue 40: 60 looks left 36–45 of 50, as if the channel had closed
// mid-look).
func TestLooksNeverCountOnAQuorumDLQWithTheBrokersDefaultLimit(t *testing.T) {
	const n = 50
	looks, perLook := 100, 0 // 4.3: a nack does not count
	if !brokertest.AtLeast(t, 4, 3) {
		looks, perLook = 10, 1 // 3.10 and 4.0 count every nack: stay under 4.0's default of 20
	}
	topo := dlx.Topology{Queue: brokertest.Name(t, "work"), Type: dlx.Quorum, DLQWithBrokerDefaultLimit: true}
	t.Cleanup(func() {
		brokertest.DeleteQueue(t, topo.Queue)
		brokertest.DeleteQueue(t, topo.DLQ())
	})
	if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
		t.Fatal(err)
	}
	withDeadLettersOn(t, topo, n)
	lists := 0 // looks that take every dead letter; a show takes those up to its id
	for i := range looks {
		args := []string{"dlq", "list", topo.DLQ()}
		lists++
		if i%10 == 9 {
			lists--
			args = []string{"dlq", "show", topo.DLQ(), "--id", fmt.Sprintf("order-%d", i%n)}
		}
		if code, out, errOut := amqpretry(t, args...); code != 0 {
			t.Errorf("look %d (%v): exit %d: %s%s", i, args, code, out, errOut)
		}
	}
	counts := map[string]int{}
	for _, d := range drainQueue(t, topo.DLQ()) {
		c, _ := amqphdr.Count(d.Headers[amqphdr.XDeliveryCount])
		counts[d.MessageId] = c
	}
	if len(counts) != n {
		t.Errorf("%d dead letters left of %d after %d looks", len(counts), n, looks)
	}
	// At most one count per look, at least one per list, on 3.10 and 4.0.
	least, most := lists*perLook, looks*perLook
	wrong := 0
	hist := map[int]int{}
	for id, c := range counts {
		hist[c]++
		if c < least || c > most {
			wrong++
			if wrong <= 5 {
				t.Errorf("%s: x-delivery-count %d after %d looks, want %d to %d", id, c, looks, least, most)
			}
		}
	}
	t.Logf("%d looks: x-delivery-count histogram %v", looks, hist)
	if wrong > 0 {
		t.Errorf("%d of %d dead letters counted their looks wrongly", wrong, len(counts))
	}
}
