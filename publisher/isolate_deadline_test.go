package publisher_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/pubasync"
	"github.com/amqpretry/amqpretry/publisher"
)

// Async publishes are in flight on a channel that the broker closes with an
// exception its text pins on none of them (the first went to an internal
// exchange), and the deadline of some of them passes while the isolator
// searches for the cause: the connection is frozen at the start of the
// search's second round, in which the culprit's group of 8 is sent again,
// each message alone. The deadline is the context's, the confirm timeout
// (WithConfirmTimeout) or the publish's own timeout (the recoverers'), and
// the freeze comes before the solo sends or after them, before their
// confirms.
//
// Each publish whose deadline passed gets exactly one done, during the
// search and soon after its deadline, saying it was not confirmed and may or
// may not have been stored; a solo confirm that comes after it calls no
// done again. The other innocents are confirmed and on the queue, the
// culprit is refused with a *ChannelError, Close returns soon and no
// goroutine outlives the Publisher. A message whose deadline passed before
// its solo send is not sent: the isolator sends no message whose caller was
// told it was not confirmed.
func TestPublishAsyncDeadlinePassesDuringTheSearch(t *testing.T) {
	brokertest.Dial(t) // skip at once without a broker
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
	for _, deadline := range []string{"context deadline", "confirm timeout", "own timeout"} {
		for _, frozen := range []string{"before the solo sends", "after the solo sends"} {
			t.Run(deadline+", frozen "+frozen, func(t *testing.T) {
				t.Parallel()
				testDeadlineDuringSearch(t, deadline, frozen == "after the solo sends")
			})
		}
	}
}

func testDeadlineDuringSearch(t *testing.T, deadline string, afterSends bool) {
	const (
		n       = 64              // in flight: round 1 tries 8 groups of 8, round 2 the culprit's group alone
		short   = 2 * time.Second // the deadline that passes during round 2
		latency = 40 * time.Millisecond
	)
	q, internal, ch := unpinnedFixture(t)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	t.Cleanup(func() { proxy.Blackhole(false) })
	opts := []publisher.Option{publisher.WithChannels(1), publisher.WithMaxInFlight(n)}
	if deadline == "confirm timeout" {
		opts = append(opts, publisher.WithConfirmTimeout(short))
	}
	p := newPublisher(t, url, opts...)
	if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueuePurge(q, false); err != nil {
		t.Fatal(err)
	}

	// Which publishes have the short deadline: with the confirm timeout,
	// all; else every other one, and the culprit's whole group (0-7) when
	// the freeze comes after the solo sends, so that the first solo out,
	// whichever it is, has its outcome come after its deadline.
	hasShort := func(i int) bool {
		return deadline == "confirm timeout" || i%2 == 1 || (afterSends && i < 8)
	}
	// Those of the group sent alone in round 2 time out during the search
	// for certain. One of another group that the freeze catches still
	// unconfirmed may time out too, if its deadline is short.
	timesOut := func(i int) bool { return i < 8 && hasShort(i) }
	var (
		calls     atomic.Int64
		mu        sync.Mutex
		errs      = make([]error, n)
		called    = make([]int, n)
		doneAt    = make([]time.Time, n)
		searching = make([]int, n) // searches under way when done was called
		began     = make([]time.Time, n)
		long      = ctxTimeout(t, time.Minute)
		cancels   []context.CancelFunc
	)
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	proxy.Blackhole(true) // every message sent before the broker reads the first
	for i := range n {
		exchange, key := "", q
		if i == 0 {
			exchange, key = internal, ""
		}
		msg := amqp.Publishing{Body: []byte(fmt.Sprint(i))}
		done := func(err error) {
			calls.Add(1)
			mu.Lock()
			defer mu.Unlock()
			called[i]++
			if called[i] > 1 {
				t.Errorf("done of publish %d called again: %v, after %v", i, err, errs[i])
				return
			}
			errs[i], doneAt[i], searching[i] = err, time.Now(), publisher.Searching(p)
		}
		began[i] = time.Now()
		var err error
		switch {
		case deadline == "context deadline" && hasShort(i):
			ctx, cancel := context.WithTimeout(context.Background(), short)
			cancels = append(cancels, cancel)
			err = p.PublishAsync(ctx, exchange, key, msg, done)
		case deadline == "own timeout":
			timeout := time.Minute
			if hasShort(i) {
				timeout = short
			}
			err = pubasync.Publish(p, long, exchange, key, msg, false, timeout, done)
		default:
			err = p.PublishAsync(long, exchange, key, msg, done)
		}
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	brokertest.Eventually(t, 10*time.Second, "every message sent", func() bool { return publisher.Unconfirmed(p) == n })
	// Rounds slow enough to freeze one at a chosen point.
	proxy.SetLatency(latency)
	proxy.Blackhole(false)

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		limit := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(limit) {
				t.Fatalf("after 10s: %s", what)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	waitFor("the search's second round", func() bool { return publisher.SuspectRounds(p) >= 2 })
	if afterSends {
		// The warm-up, the n on the shared channel, the n of round 1 and
		// a first solo of round 2 read by the proxy, which forwards it a
		// latency later: its outcome cannot be back before the freeze.
		waitFor("a solo send", func() bool { return proxy.Sent("basic.publish") >= 1+n+n+1 })
	}
	proxy.Blackhole(true)
	// The solos that went out before the freeze: the proxy counts a chunk
	// it read as it lets it through, a moment after the check.
	time.Sleep(10 * time.Millisecond)
	solosOut := proxy.Sent("basic.publish") - (1 + n + n)

	waitFor("the dones of the solo round's publishes whose deadline passed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range n {
			if timesOut(i) && called[i] == 0 {
				return false
			}
		}
		return true
	})
	if s := publisher.Searching(p); s != 1 {
		t.Fatalf("%d searches under way after the deadlines passed, want the one frozen", s)
	}
	mu.Lock()
	for i := range 8 {
		if !timesOut(i) && called[i] != 0 {
			t.Errorf("publish %d of the frozen round had its done: %v", i, errs[i])
		}
	}
	mu.Unlock()
	proxy.SetLatency(0)
	proxy.Blackhole(false)

	brokertest.Eventually(t, 15*time.Second, "every done", func() bool { return calls.Load() >= n })
	brokertest.Eventually(t, 10*time.Second, "the search to end", func() bool { return publisher.Searching(p) == 0 })
	time.Sleep(500 * time.Millisecond) // time for a late solo confirm to call a done again
	if got := calls.Load(); got != n {
		t.Fatalf("%d done calls for %d publishes", got, n)
	}

	onQueue := brokertest.CountBodies(t, ch, q)
	mu.Lock()
	lateOutcomes := 0
	for i := range n {
		err, body := errs[i], fmt.Sprint(i)
		switch {
		case timesOut(i) || (hasShort(i) && err != nil):
			if !errors.Is(err, publisher.ErrNotConfirmed) || !strings.Contains(err.Error(), "may or may not have been stored") {
				t.Errorf("publish %d, timed out: %v, want ErrNotConfirmed saying it may or may not have been stored", i, err)
				continue
			}
			if want := deadline == "confirm timeout"; strings.Contains(err.Error(), "WithConfirmTimeout") != want || errors.Is(err, context.DeadlineExceeded) == want {
				t.Errorf("publish %d, timed out: %v, want the %s's error", i, err, deadline)
			}
			if doneAt[i].Before(began[i].Add(short)) || doneAt[i].After(began[i].Add(short+3*time.Second)) {
				t.Errorf("publish %d timed out %v after it began, want %v to %v", i, doneAt[i].Sub(began[i]), short, short+3*time.Second)
			}
			if searching[i] != 1 {
				t.Errorf("publish %d timed out with %d searches under way, want it during the search", i, searching[i])
			}
			if onQueue[body] > 0 {
				lateOutcomes++ // sent again, stored, confirmed after its done
			}
			// Its deadline passed while its solo channel opened: it is not
			// sent after its done said it was not confirmed.
			if !afterSends && timesOut(i) && onQueue[body] > 0 {
				t.Errorf("publish %d timed out before its solo send, and the isolator sent it after: on the queue %d times", i, onQueue[body])
			}
		case i == 0:
			var chErr *publisher.ChannelError
			if !errors.As(err, &chErr) || chErr.Code != amqp.AccessRefused {
				t.Errorf("the culprit: %v, want a *ChannelError with 403", err)
			}
		default:
			if err != nil {
				t.Errorf("innocent %d: %v", i, err)
			} else if onQueue[body] == 0 {
				t.Errorf("innocent %d confirmed but not on the queue", i)
			}
		}
	}
	mu.Unlock()
	if afterSends {
		// Every solo that went out before the freeze had its outcome come
		// after its done, a confirm that called no done again (the
		// culprit's, a 403 that did not either): each but the culprit's is
		// on the queue.
		t.Logf("%d solos out before the freeze; %d publishes that timed out are on the queue, confirmed after their done", solosOut, lateOutcomes)
		if solosOut < 1 || lateOutcomes < solosOut-1 {
			t.Errorf("%d solos out before the freeze, %d of them stored: want at least one out, and all but the culprit's stored", solosOut, lateOutcomes)
		}
	}

	closed := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(closed); took > 5*time.Second {
		t.Errorf("Close took %v", took)
	}
}
