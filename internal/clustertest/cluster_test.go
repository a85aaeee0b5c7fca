package clustertest_test

import (
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/clustertest"
)

// TestQuorumQueueSurvivesLeaderKill proves the cluster is one: a quorum
// queue declared through one node takes confirmed messages through another
// and delivers them through the third, and when its leader's beam is killed
// another node leads and no message is lost.
func TestQuorumQueueSurvivesLeaderKill(t *testing.T) {
	urls := clustertest.Require(t)
	queue := "amqpretry-clustertest." + randomHex(4)
	const total, firstHalf = 200, 100

	declare := channel(t, urls[0])
	if _, err := declare.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatalf("declare %s through n1: %v", queue, err)
	}
	t.Cleanup(func() { deleteQueue(t, urls, queue) })

	pub := channel(t, urls[1])
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := range total {
		conf, err := pub.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{
			MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent, Body: []byte("m"),
		})
		if err != nil {
			t.Fatalf("publish %d through n2: %v", i, err)
		}
		if !conf.Wait() {
			t.Fatalf("publish %d through n2: nacked", i)
		}
	}

	got := consume(t, urls[2], queue, firstHalf)

	leader := clustertest.Leader(t, queue)
	if !slices.Contains(clustertest.Nodes, leader) {
		t.Fatalf("leader of %s is %q, not a node of the cluster", queue, leader)
	}
	t.Logf("%s is led by %s; killing it", queue, leader)
	killed := time.Now()
	clustertest.Run(t, "kill", leader)

	var next string
	deadline := time.Now().Add(60 * time.Second)
	for {
		if next = clustertest.Leader(t, queue); next != "" && next != leader {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("60s after killing %s, %s is led by %q", leader, queue, next)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s leads %s %v after the kill", next, queue, time.Since(killed).Round(10*time.Millisecond))

	// The rest, through a survivor that does not lead, so the read goes
	// through the cluster rather than only the new leader.
	survivor := next
	for _, n := range clustertest.Nodes {
		if n != leader && n != next {
			survivor = n
		}
	}
	got = append(got, consume(t, clustertest.URL(t, survivor), queue, total-firstHalf)...)
	slices.Sort(got)
	for i, id := range got {
		if id != i {
			t.Fatalf("message ids after the kill: want 0..%d once each, got %v", total-1, got)
		}
	}
	if len(got) != total {
		t.Fatalf("got %d messages, want %d", len(got), total)
	}

	clustertest.Run(t, "start", leader)
	// status fails unless every node answers and sees three running members.
	clustertest.Run(t, "status")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// channel dials url and opens a channel, both closed when the test ends.
func channel(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel on %s: %v", url, err)
	}
	return ch
}

// consume takes n messages from queue through url, acks them, and returns
// their ids; it fails the test if they do not arrive within 30 s.
func consume(t *testing.T, url, queue string, n int) []int {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	// Closed on return, not at the end of the test: prefetched messages
	// beyond n go back to the queue for the next consumer.
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(20, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume %s through %s: %v", queue, url, err)
	}
	var ids []int
	timeout := time.After(30 * time.Second)
	for len(ids) < n {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("the consumer on %s closed after %d of %d messages", url, len(ids), n)
			}
			id, err := strconv.Atoi(d.MessageId)
			if err != nil {
				t.Fatalf("message id %q", d.MessageId)
			}
			ids = append(ids, id)
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		case <-timeout:
			t.Fatalf("30s: %d of %d messages through %s", len(ids), n, url)
		}
	}
	return ids
}

// deleteQueue deletes the queue through the first node that answers.
func deleteQueue(t *testing.T, urls []string, queue string) {
	for _, u := range urls {
		conn, err := amqp.Dial(u)
		if err != nil {
			continue
		}
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(queue, false, false, false)
		}
		_ = conn.Close()
		if err == nil {
			return
		}
	}
	t.Logf("cleanup: could not delete %s through any node", queue)
}
