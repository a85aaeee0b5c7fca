package dlx_test

import (
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// returns hands one message on queue back up to max times, with a nack or a
// reject, and reports how many times it was delivered before the broker let
// it go (max+1 when it is still there) and the last x-delivery-count seen.
func returns(t *testing.T, queue string, max int, nack bool) (delivered int, lastCount any) {
	t.Helper()
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for delivered < max+1 {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return delivered, lastCount
		}
		delivered++
		lastCount = d.Headers["x-delivery-count"]
		if delivered == max+1 {
			_ = d.Nack(false, true)
			break
		}
		if nack {
			err = d.Nack(false, true)
		} else {
			err = d.Reject(true)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return delivered, lastCount
}

// What docs/rabbitmq-versions.md says of a quorum DLQ, on the broker
// under test: the Topology's DLQ keeps a dead letter however often it is
// looked at; declared without x-delivery-limit (DLQWithBrokerDefaultLimit) it
// has the broker's default limit (none on 3, 20 on 4, where being looked at
// counts); x-delivery-limit -1 is unlimited on 4 but drops a message at its
// first return on 3.10; math.MaxInt32, the Topology's, is unlimited in
// practice on both.
func TestQuorumDLQDeliveryLimit(t *testing.T) {
	major := brokertest.Major(t)
	nacksCount := !brokertest.AtLeast(t, 4, 3) // a look hands a dead letter back with a nack
	kept := func(int) int { return 31 }
	tests := []struct {
		name      string
		topo      dlx.Topology
		delivered func(major int) int // before the message is gone; 31 = still there after 30 returns
	}{
		{"topology default", dlx.Topology{}, kept},
		{"DLQWithBrokerDefaultLimit", dlx.Topology{DLQWithBrokerDefaultLimit: true}, func(major int) int {
			if major >= 4 && nacksCount {
				return 21 // 4.0: the default limit of 20, and every look counts
			}
			return 31 // 3.x: no default limit; 4.3: a look (a nack) does not count
		}},
		{"-1", dlx.Topology{DLQArguments: amqp.Table{"x-delivery-limit": int64(-1)}}, func(major int) int {
			if major >= 4 {
				return 31
			}
			return 1
		}},
		{"MaxInt32", dlx.Topology{DLQArguments: amqp.Table{"x-delivery-limit": int64(math.MaxInt32)}}, kept},
		// The migration the ConflictError suggests for a DLQ created without
		// the limit: declared as it is, and a policy gives it the limit.
		{"DLQWithBrokerDefaultLimit and the policy", dlx.Topology{DLQWithBrokerDefaultLimit: true}, kept},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.topo.Type = dlx.Quorum
			topo := topology(t, tt.topo)
			declare(t, topo)
			if strings.HasSuffix(tt.name, "policy") {
				applyTo := "quorum_queues"
				if major < 4 {
					applyTo = "queues" // 3.x knows no quorum_queues, and has no default limit anyway
				}
				policy := topo.DLQ() + "-delivery-limit"
				brokertest.Rabbitmqctl(t, "set_policy", policy, "^"+regexp.QuoteMeta(topo.DLQ())+"$", `{"delivery-limit": 2147483647}`, "--apply-to", applyTo)
				t.Cleanup(func() { _, _ = brokertest.Ctl("clear_policy", policy) })
				brokertest.Eventually(t, 10*time.Second, "the policy applied to the DLQ", func() bool { // it applies asynchronously
					out, err := brokertest.Ctl("list_queues", "-q", "name", "policy")
					return err == nil && strings.Contains(out, policy)
				})
			}
			brokertest.Publish(t, topo.DLQ(), amqp.Publishing{Body: []byte("a dead letter")})
			got, count := returns(t, topo.DLQ(), 30, true)
			if want := tt.delivered(major); got != want {
				t.Fatalf("RabbitMQ %d: delivered %d times before the broker let it go (31: kept), want %d; last x-delivery-count %v", major, got, want, count)
			}
		})
	}
}

// What counts toward a quorum queue's delivery limit, by broker: RabbitMQ
// 3.10 and 4.0 count a nack as they count a reject; from 4.3 only a reject
// (a failure) counts, and a nack (a hand-back that is not the message's
// fault) returns it as often as it likes. The settlement rules (a failure
// is a reject, a shutdown a nack) rest on this.
func TestWhatCountsTowardTheDeliveryLimit(t *testing.T) {
	nackCounts := !brokertest.AtLeast(t, 4, 3)
	for _, nack := range []bool{false, true} {
		q := brokertest.Name(t, "q")
		brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(3)})
		brokertest.Publish(t, q, amqp.Publishing{Body: []byte("x")})
		got, _ := returns(t, q, 10, nack)
		want := 4 // the first delivery and 3 returns, then the broker lets it go
		if nack && !nackCounts {
			want = 11 // still there after 10 returns
		}
		if got != want {
			major, minor := brokertest.Version(t)
			t.Errorf("RabbitMQ %d.%d, nack=%v: delivered %d times with x-delivery-limit 3, want %d", major, minor, nack, got, want)
		}
	}
}

// x-delivery-count, by broker and by how the message came back: on a
// basic.get's first delivery 3.10 says 0 and 4.x leaves it out; after
// returns 3.10 and 4.0 count nacks and rejects alike from 1, and 4.3 counts
// rejects only (a nacked message comes back without the header). The
// listener and dlx's Redeliver read each.
func TestDeliveryCountHeader(t *testing.T) {
	major := brokertest.Major(t)
	nackCounts := !brokertest.AtLeast(t, 4, 3)
	for _, nack := range []bool{false, true} {
		q := brokertest.Name(t, "q")
		brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum"})
		brokertest.Publish(t, q, amqp.Publishing{Body: []byte("x")})
		ch := brokertest.Channel(t, brokertest.Dial(t))
		var counts []any
		for range 3 {
			d, ok, err := ch.Get(q, false)
			if err != nil || !ok {
				t.Fatalf("get: %v %v", ok, err)
			}
			counts = append(counts, d.Headers["x-delivery-count"])
			if nack {
				_ = d.Nack(false, true)
			} else {
				_ = d.Reject(true)
			}
		}
		want := []any{int64(0), int64(1), int64(2)}
		if major >= 4 {
			want[0] = nil
		}
		if nack && !nackCounts {
			want = []any{nil, nil, nil}
		}
		if fmt.Sprint(counts) != fmt.Sprint(want) {
			t.Errorf("nack=%v: x-delivery-count by delivery %v, want %v", nack, counts, want)
		}
	}
}

// Why Validate refuses DeliveryLimit (and arguments that dead-letter on
// their own) with SingleRetryDelay: in that layout the work queue
// dead-letters everything into the retry queue, whose TTL sends it back, and
// a message that goes round such a cycle without a rejection is dropped by
// the broker without a word. Here the layout is declared by hand, as
// Declare would have, with a delivery limit of 1: past it the message is
// gone from both queues, on every version tested.
func TestSingleRetryLayoutDropsWhatItDoesNotReject(t *testing.T) {
	q := brokertest.Name(t, "work")
	retry := q + ".retry"
	brokertest.Queue(t, retry, amqp.Table{"x-queue-type": "quorum", "x-message-ttl": int64(100), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": q})
	brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(1), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry})
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "m", Body: []byte("x"), DeliveryMode: amqp.Persistent})
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for range 2 { // the first delivery and one return: then past the limit
		d, ok, err := ch.Get(q, false)
		if err != nil || !ok {
			t.Fatalf("get: %v %v", ok, err)
		}
		if err := d.Reject(true); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // ten times the retry queue's TTL
	if w, r := brokertest.Depth(t, q), brokertest.Depth(t, retry); w != 0 || r != 0 {
		major, minor := brokertest.Version(t)
		t.Errorf("RabbitMQ %d.%d kept the message (work queue %d, retry queue %d): it no longer drops such cycles, and Validate may relax", major, minor, w, r)
	}
}

// A look that ends without handing the dead letter back (the command
// killed, its connection lost: here the channel closes with the message
// unacked) counts toward the delivery limit on every version, 4.3 included,
// where only a nack does not. So a quorum DLQ declared with
// DLQWithBrokerDefaultLimit keeps RabbitMQ 4's default of 20 in play on 4.3
// too, and loses the dead letter at the 21st such look; 3.x has no default
// limit; the Topology's own DLQ keeps it.
func TestALookCutOffCountsOnEveryVersion(t *testing.T) {
	major := brokertest.Major(t)
	for _, tt := range []struct {
		name string
		topo dlx.Topology
		kept bool
	}{
		{"topology default", dlx.Topology{}, true},
		{"DLQWithBrokerDefaultLimit", dlx.Topology{DLQWithBrokerDefaultLimit: true}, major < 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.topo.Type = dlx.Quorum
			topo := topology(t, tt.topo)
			declare(t, topo)
			brokertest.Publish(t, topo.DLQ(), amqp.Publishing{Body: []byte("a dead letter")})
			var count any
			for look := range 21 {
				brokertest.Eventually(t, 5*time.Second, fmt.Sprintf("the dead letter back before look %d", look+1), func() bool {
					return brokertest.Depth(t, topo.DLQ()) == 1
				})
				ch := brokertest.Channel(t, brokertest.Dial(t))
				d, ok, err := ch.Get(topo.DLQ(), false)
				if err != nil || !ok {
					t.Fatalf("look %d: %v %v", look+1, ok, err)
				}
				count = d.Headers["x-delivery-count"]
				_ = ch.Close() // unacked: the broker takes it back
			}
			time.Sleep(500 * time.Millisecond)
			if kept := brokertest.Depth(t, topo.DLQ()) == 1; kept != tt.kept {
				major, minor := brokertest.Version(t)
				t.Errorf("RabbitMQ %d.%d: the dead letter kept after 21 looks cut off: %v, want %v (last x-delivery-count %v)", major, minor, kept, tt.kept, count)
			}
		})
	}
}
