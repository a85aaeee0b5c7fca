package inbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"strings"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/outbox/inbox"
)

// Finding 6 of issue 26: a MessageId that PostgreSQL's text cannot hold
// (a NUL byte, bytes that are not UTF-8) made the insert fail with an
// ordinary, retryable error, so a requeueing chain looped on the message.
// Such an id is now recorded in an escaped form: the message is processed
// once, its redelivery skipped, and it is never confused with another id.
func TestMessageIDThatTextCannotHold(t *testing.T) {
	ib, db, schema := setup(t)
	var calls atomic.Int32
	h := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		calls.Add(1)
		return nil
	})
	ids := []string{"a\x00b", "a\xffb", "\xfe", "ab", "a", "b", "x\x00", "x"}
	for round := range 2 {
		for _, id := range ids {
			if err := h(context.Background(), &amqp.Delivery{MessageId: id}); err != nil {
				t.Fatalf("round %d, id %q: %v", round+1, id, err)
			}
		}
	}
	if int(calls.Load()) != len(ids) {
		t.Fatalf("the handler ran %d times for %d distinct ids delivered twice each, want once per id", calls.Load(), len(ids))
	}
	if n := count(t, db, `SELECT count(*) FROM `+schema+`.inbox`); n != len(ids) {
		t.Fatalf("%d records, want %d", n, len(ids))
	}
}

// A consumer name PostgreSQL's text cannot hold is refused by New.
func TestConsumerNameThatTextCannotHold(t *testing.T) {
	_, db, _ := setup(t)
	for _, name := range []string{"bill\x00ing", "bill\xffing"} {
		if _, err := inbox.New(db, inbox.WithConsumerName(name)); err == nil || !strings.Contains(err.Error(), "WithConsumerName") {
			t.Errorf("WithConsumerName(%q): %v, want an error naming the option", name, err)
		}
	}
}

// A trap of issue 26, documented rather than fixed: the key is the
// message's identity, so two different events published with one business
// id as their MessageId look to the inbox like a message and its
// redelivery, and the second is skipped. The producer must give each
// message an id of its own (the outbox does when MessageId is left empty).
func TestReusedMessageIDSkipsTheSecondEvent(t *testing.T) {
	ib, _, _ := setup(t)
	var types []string
	h := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		types = append(types, d.Type)
		return nil
	})
	for _, typ := range []string{"order.created", "order.paid"} {
		if err := h(context.Background(), &amqp.Delivery{MessageId: "order-42", Type: typ}); err != nil {
			t.Fatal(err)
		}
	}
	if len(types) != 1 || types[0] != "order.created" {
		t.Fatalf("handled %v; the documented behaviour is that only the first event with a given id runs", types)
	}
}

// An "also" of issue 35: a key (WithKey) over about 2.7 KB exceeded
// PostgreSQL's btree row limit, so its insert failed with an ordinary,
// retryable error on every delivery and the message looped. A long key is
// now recorded by its SHA-256: the message is processed once, its
// redelivery skipped, and keys that differ only at their end stay apart.
func TestLongKeysAreDeduplicated(t *testing.T) {
	random := make([]byte, 3000)
	_, _ = rand.Read(random)
	long := base64.StdEncoding.EncodeToString(random) // 4000 bytes PostgreSQL cannot compress
	ib, db, schema := setup(t, inbox.WithKey(func(d *amqp.Delivery) (string, error) {
		key, _ := d.Headers["key"].(string)
		return key, nil
	}))
	var calls atomic.Int32
	h := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		calls.Add(1)
		return nil
	})
	keys := []string{long + "a", long + "b", long[:2000] + strings.Repeat("\xff", 1000), "amqpretry-hex:sha256:" + strings.Repeat("0", 64)}
	for round := range 2 {
		for _, key := range keys {
			if err := h(context.Background(), &amqp.Delivery{Headers: amqp.Table{"key": key}}); err != nil {
				t.Fatalf("round %d, a key of %d bytes: %v", round+1, len(key), err)
			}
		}
	}
	if int(calls.Load()) != len(keys) {
		t.Fatalf("the handler ran %d times for %d distinct keys delivered twice each, want once per key", calls.Load(), len(keys))
	}
	if n := count(t, db, `SELECT count(*) FROM `+schema+`.inbox`); n != len(keys) {
		t.Fatalf("%d records, want %d", n, len(keys))
	}
}
