package publisher_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/publisher"
)

// countingHandler counts connection losses the publisher logs.
type countingHandler struct {
	slog.Handler
	losses *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "connection lost") {
		h.losses.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

// Messages amqp091 cannot encode, or the broker could not take in one frame,
// are refused before anything is sent: the connection, and every publish in
// flight on it, stays up.
func TestInvalidMessagesDoNotTouchTheConnection(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	var losses atomic.Int64
	logger := slog.New(countingHandler{slog.NewTextHandler(testWriter{t}, nil), &losses})
	p := newPublisher(t, brokertest.URL(), publisher.WithLogger(logger))
	long := strings.Repeat("x", 256)
	cyclic := amqp.Table{}
	cyclic["self"] = cyclic
	tests := map[string]struct {
		exchange, key string
		msg           amqp.Publishing
	}{
		"long message-id":      {"", q, amqp.Publishing{MessageId: long}},
		"long routing key":     {"", long, amqp.Publishing{}},
		"long header name":     {"", q, amqp.Publishing{Headers: amqp.Table{long: 1}}},
		"headers over a frame": {"", q, amqp.Publishing{Headers: amqp.Table{"big": strings.Repeat("y", 140_000)}}},
		"cyclic headers":       {"", q, amqp.Publishing{Headers: cyclic}},
		// The broker would close the channel on these (406).
		"expiration not a number":  {"", q, amqp.Publishing{Expiration: "1.5"}},
		"negative expiration":      {"", q, amqp.Publishing{Expiration: "-5"}},
		"expiration over 10 years": {"", q, amqp.Publishing{Expiration: "315360000001"}},
		"another user's user-id":   {"", q, amqp.Publishing{UserId: "someone-else"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			err := p.Publish(ctxTimeout(t, 5*time.Second), tt.exchange, tt.key, tt.msg)
			if !errors.Is(err, publisher.ErrInvalidMessage) {
				t.Fatalf("err = %v, want ErrInvalidMessage", err)
			}
		})
	}
	if err := p.Publish(ctxTimeout(t, 5*time.Second), "", q, amqp.Publishing{Body: []byte("fine")}); err != nil {
		t.Fatal(err)
	}
	if n := losses.Load(); n != 0 {
		t.Errorf("%d connection losses: an invalid message must not reach amqp091", n)
	}
}

// A stream of publishes to a missing exchange closes the shared channel again
// and again; the good publishes on it must all still be confirmed.
func TestOthersChannelExceptionsDoNotFailGoodMessages(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, brokertest.URL(), publisher.WithChannels(1))
	missing := brokertest.Name(t, "missing")
	var wg sync.WaitGroup
	var good, bad atomic.Int64
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				if w == 0 && i%4 == 0 {
					if err := p.Publish(ctxTimeout(t, 10*time.Second), missing, "k", amqp.Publishing{}); err != nil {
						bad.Add(1)
					}
					continue
				}
				if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte(fmt.Sprint(w, i))}); err != nil {
					t.Errorf("good publish %d-%d: %v", w, i, err)
				} else {
					good.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 25 || good.Load() != 575 {
		t.Fatalf("bad %d (want 25 failures), good %d (want 575)", bad.Load(), good.Load())
	}
	// Good messages in flight when a neighbour's 404 closed the channel may
	// have been stored unconfirmed and published again: duplicates, never a gap.
	distinct := map[string]bool{}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for {
		d, ok := brokertest.Get(t, ch, q)
		if !ok {
			break
		}
		distinct[string(d.Body)] = true
	}
	if len(distinct) != 575 {
		t.Fatalf("%d distinct messages on the queue, want all 575 confirmed ones", len(distinct))
	}
}

// The broker closes the channel on a publish, and its text names no
// message (403: a publish to an internal exchange). The message that caused
// it fails, alone, with a *ChannelError; each neighbour that was awaiting
// its confirm on that channel is sent again once, alone, and confirmed.
func TestAnUnattributedChannelExceptionFailsOnlyItsCause(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	internal := brokertest.Name(t, "internal")
	ch := brokertest.Channel(t, brokertest.Dial(t))
	if err := ch.ExchangeDeclare(internal, "fanout", false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, brokertest.URL(), publisher.WithChannels(1))
	var wg sync.WaitGroup
	var culprit error
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if w == 0 && i == 25 {
					culprit = p.Publish(ctxTimeout(t, 10*time.Second), internal, "", amqp.Publishing{Body: []byte("bad")})
					continue
				}
				if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte(fmt.Sprint(w, "-", i))}); err != nil {
					t.Errorf("good publish %d-%d: %v", w, i, err)
				}
			}
		}()
	}
	wg.Wait()
	var chErr *publisher.ChannelError
	if !errors.As(culprit, &chErr) || chErr.Code != amqp.AccessRefused {
		t.Fatalf("the culprit's publish: %v, want a *ChannelError with 403", culprit)
	}
	copies := brokertest.CountBodies(t, ch, q)
	for body, n := range copies {
		if n > 2 {
			t.Errorf("%s is on the queue %d times: sent again more than once", body, n)
		}
	}
	if len(copies) != 399 {
		t.Fatalf("%d distinct messages on the queue, want all 399 good ones", len(copies))
	}
}

// With WithImpersonation the publisher sends a foreign user-id, and a
// broker that refuses it (the user lacks the impersonator tag) fails that
// message alone.
func TestImpersonationSendsAForeignUserID(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, brokertest.URL(), publisher.WithImpersonation())
	err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{UserId: "someone-else"})
	var chErr *publisher.ChannelError
	if !errors.As(err, &chErr) || !strings.Contains(chErr.Reason, "someone-else") {
		t.Fatalf("%v: want the broker's refusal as a *ChannelError", err)
	}
	if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{UserId: p.Username()}); err != nil {
		t.Fatal(err)
	}
}

// The broker stops reading the publisher's socket (a hung broker, a
// partition): writes block in the kernel. Publishes queued behind the stuck
// one return at their deadline; the stuck one returns once the watchdog
// closes the connection after two heartbeats; Close does not hang.
func TestStuckWritesAreBounded(t *testing.T) {
	proxy, url := brokertest.Proxy(t)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, url, publisher.WithChannels(1), publisher.WithHeartbeat(time.Second), publisher.WithCloseTimeout(time.Second))

	proxy.Blackhole(true)
	body := make([]byte, 4<<20) // fills the socket buffers at once
	results := make(chan time.Duration, 4)
	for range 4 {
		go func() {
			begin := time.Now()
			_ = p.Publish(ctxTimeout(t, time.Second), "", q, amqp.Publishing{Body: body})
			results <- time.Since(begin)
		}()
	}
	for range 4 {
		select {
		case took := <-results:
			if took > 6*time.Second {
				t.Errorf("a publish returned after %v", took)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a publish is still stuck after 10s")
		}
	}
	proxy.Blackhole(false)
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs")
	}
}

// RabbitMQ 4.0 refuses messages over 16 MiB (max_message_size; 3.10 allows
// 128 MiB) by closing the channel with 406, naming the size. The publish
// fails at once with the broker's reason, without being sent again (each try
// would close the channel under its neighbours); messages published beside
// it on the same channel are confirmed.
func TestMessageOverTheBrokersMaximumSize(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	p := newPublisher(t, url, publisher.WithChannels(1))
	const neighbours = 20
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range neighbours {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte("small")}); err != nil {
				failed.Add(1)
				t.Errorf("a neighbour failed: %v", err)
			}
		}()
	}
	err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: make([]byte, 16<<20+1)})
	wg.Wait()
	var cerr *publisher.ChannelError
	switch major := brokertest.Major(t); {
	case major >= 4 && (!errors.As(err, &cerr) || cerr.Code != amqp.PreconditionFailed || !strings.Contains(cerr.Reason, "larger than configured max size")):
		t.Fatalf("RabbitMQ 4: err = %v, want a *ChannelError 406 saying the message is too large", err)
	case major < 4 && err != nil:
		t.Fatalf("RabbitMQ 3.10 takes messages up to 128 MiB: err = %v", err)
	}
	// Two channels at the start (the shared one and the one a suspect is
	// sent again on alone), one to replace the closed: no more.
	if opened := proxy.Sent("channel.open"); err != nil && opened != 3 {
		t.Errorf("the publisher opened %d channels: the message too large was sent again instead of failing at once", opened)
	}
	want := neighbours
	if err == nil {
		want++
	}
	brokertest.Eventually(t, 5*time.Second, "every confirmed message on the queue", func() bool { return brokertest.Depth(t, q) == want })
}

// On a headers exchange two messages may differ only in their headers: one
// routed, the other returned. The return must fail only the one it belongs
// to: a routed, confirmed message reported unroutable would be published
// again by a caller that trusts the error, a duplicate.
func TestReturnsAreMatchedByHeadersToo(t *testing.T) {
	ex, q := brokertest.Name(t, "headers"), brokertest.Name(t, "q")
	brokertest.Exchange(t, ex, "headers")
	brokertest.Queue(t, q, nil)
	ch := brokertest.Channel(t, brokertest.Dial(t))
	if err := ch.QueueBind(q, "", ex, false, amqp.Table{"x-match": "all", "route": "yes"}); err != nil {
		t.Fatal(err)
	}
	p, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const pairs = 1000
	var wrong, returned, wg = atomic.Int64{}, atomic.Int64{}, sync.WaitGroup{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range pairs {
		for _, route := range []string{"yes", "no"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Same id and body: only the headers differ.
				err := p.Publish(ctx, ex, "", amqp.Publishing{MessageId: fmt.Sprint(i), Body: []byte("same"), Headers: amqp.Table{"route": route, "n": i}})
				switch {
				case route == "yes" && err != nil:
					wrong.Add(1)
				case route == "no" && errors.Is(err, publisher.ErrUnroutable):
					returned.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	if n := wrong.Load(); n > 0 {
		t.Errorf("%d of %d routed messages were reported as failed (unroutable) because a message differing only in headers was returned", n, pairs)
	}
	if n := returned.Load(); n != pairs {
		t.Errorf("%d of %d unroutable messages reported ErrUnroutable", n, pairs)
	}
	brokertest.Eventually(t, 5*time.Second, "every routed message on the queue", func() bool { return brokertest.Depth(t, q) == pairs })
}

// Close while a message sent is still unconfirmed (the broker stopped
// answering): the publish fails with an error that matches ErrClosed and
// ErrNotConfirmed, since the broker may have stored it: a caller that
// publishes again on ErrNotConfirmed, or keeps the message for later, must
// not take ErrClosed alone to mean nothing went out.
func TestCloseWithAnUnconfirmedPublishSaysItMayBeStored(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	p, err := publisher.New(url, publisher.WithCloseTimeout(200*time.Millisecond), publisher.WithConfirmTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole(true)
	defer proxy.Blackhole(false)
	done := make(chan error, 1)
	go func() { done <- p.Publish(context.Background(), "", q, amqp.Publishing{Body: []byte("x")}) }()
	time.Sleep(300 * time.Millisecond) // sent; its confirm cannot come
	_ = p.Close()
	select {
	case err := <-done:
		if !errors.Is(err, publisher.ErrNotConfirmed) || !errors.Is(err, publisher.ErrClosed) {
			t.Errorf("Publish = %v, want an error matching ErrNotConfirmed and ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Publish did not return after Close")
	}
}
