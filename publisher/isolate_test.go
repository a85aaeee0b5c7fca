package publisher_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/publisher"
)

// 500 publishes are in flight on one channel when the broker closes it with
// an exception whose text pins it on none of them (403: the first of them
// went to an internal exchange; the broker drops the 499 sent after it). The
// culprit must fail with a *ChannelError and the 499 innocents must be
// confirmed, in a number of confirm round trips one after another that grows
// with the logarithm of the number in flight, not one per message; the
// channels opened for it are bounded too, and an innocent is stored at most
// once per round it was lost in, plus once. The same with three culprits.
func TestAnUnpinnedExceptionAmongManyInFlightTakesFewRounds(t *testing.T) {
	const inFlight = 500
	for _, culprits := range [][]int{{0}, {0, 137, 411}} {
		t.Run(fmt.Sprintf("%d culprits", len(culprits)), func(t *testing.T) {
			testUnpinnedAmongMany(t, inFlight, culprits)
		})
	}
}

func testUnpinnedAmongMany(t *testing.T, inFlight int, culprits []int) {
	q, internal, ch := unpinnedFixture(t)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	p := newPublisher(t, url, publisher.WithChannels(1))

	errs := badAmongMany(t, ctxTimeout(t, time.Minute), p, proxy, internal, q, inFlight, culprits)
	for i, err := range errs {
		var chErr *publisher.ChannelError
		switch {
		case !slices.Contains(culprits, i) && err != nil:
			t.Errorf("innocent %d: %v", i, err)
		case slices.Contains(culprits, i) && (!errors.As(err, &chErr) || chErr.Code != amqp.AccessRefused):
			t.Errorf("culprit %d: %v, want a *ChannelError with 403", i, err)
		}
	}
	rounds := publisher.SuspectRounds(p)
	opened := proxy.Sent("channel.open")
	t.Logf("%d in flight, %d culprits: %d confirm round trips one after another to find them, %d channels opened", inFlight, len(culprits), rounds, opened)
	if limit := 1 + int(math.Ceil(math.Log2(float64(inFlight)))); rounds > limit {
		t.Errorf("%d confirm round trips one after another to find the culprits among %d in flight, want at most %d (1 + log2 n)", rounds, inFlight, limit)
	}
	// The publisher's two channels, the shared one reopened, and at most 8
	// per round and culprit.
	if limit := 3 + 8*rounds*len(culprits); opened > limit {
		t.Errorf("%d channels opened, want at most %d", opened, limit)
	}

	copies := brokertest.CountBodies(t, ch, q)
	for body, n := range copies {
		if n > 1+rounds {
			t.Errorf("%s is on the queue %d times, more than once per round plus once", body, n)
		}
	}
	if len(copies) != inFlight-len(culprits) {
		t.Fatalf("%d distinct messages on the queue, want all %d innocent ones", len(copies), inFlight-len(culprits))
	}
}

// badAmongMany publishes n messages through p, whose one shared channel
// goes through proxy, all sent before the broker reads any of them, so that
// all are unconfirmed when the broker closes the channel on the first: the
// first, and those at the indexes in badAt, to the internal exchange bad, the
// others to queue q. It returns each publish's error.
func badAmongMany(tb testing.TB, ctx context.Context, p *publisher.Publisher, proxy *faultproxy.Proxy, bad, q string, n int, badAt []int) []error {
	tb.Helper()
	waitFor := func(what string, cond func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				tb.Fatalf("after 10s: %s", what)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	proxy.Blackhole(true)
	defer proxy.Blackhole(false)
	var wg sync.WaitGroup
	defer wg.Wait()
	errs := make([]error, n)
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[0] = p.Publish(ctx, bad, "", amqp.Publishing{Body: []byte("bad")})
	}()
	waitFor("the bad message sent", func() bool { return publisher.Unconfirmed(p) == 1 })
	for i := 1; i < n; i++ {
		exchange, key := "", q
		if slices.Contains(badAt, i) {
			exchange, key = bad, ""
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Publish(ctx, exchange, key, amqp.Publishing{Body: []byte(fmt.Sprint(i))})
		}()
	}
	waitFor("every message sent", func() bool { return publisher.Unconfirmed(p) == n })
	proxy.Blackhole(false)
	wg.Wait()
	return errs
}

// The connection is cut while the publisher searches 500 lost messages for
// the cause of an unpinned exception. The search ends with the connection;
// every message is published again after the redial, and the cause is found
// again there: it fails, each other message is confirmed and on the queue,
// and no goroutine of the search outlives the Publisher.
func TestAConnectionCutDuringTheSearch(t *testing.T) {
	const inFlight = 500
	q, internal, ch := unpinnedFixture(t)
	proxy, url := brokertest.Proxy(t)
	p := newPublisher(t, url, publisher.WithChannels(1))
	proxy.SetLatency(10 * time.Millisecond) // rounds long enough to cut one
	cut := make(chan struct{})
	go func() {
		defer close(cut)
		deadline := time.Now().Add(20 * time.Second)
		for publisher.SuspectRounds(p) == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		proxy.CutAll()
		proxy.SetLatency(0)
	}()
	errs := badAmongMany(t, ctxTimeout(t, time.Minute), p, proxy, internal, q, inFlight, nil)
	<-cut
	var chErr *publisher.ChannelError
	if !errors.As(errs[0], &chErr) || chErr.Code != amqp.AccessRefused {
		t.Errorf("the culprit: %v, want a *ChannelError with 403", errs[0])
	}
	for i, err := range errs[1:] {
		if err != nil {
			t.Errorf("innocent %d: %v", i+1, err)
		}
	}
	distinct := map[string]bool{}
	for {
		d, ok := brokertest.Get(t, ch, q)
		if !ok {
			break
		}
		distinct[string(d.Body)] = true
	}
	if len(distinct) != inFlight-1 {
		t.Fatalf("%d distinct messages on the queue, want all %d innocent ones", len(distinct), inFlight-1)
	}
}

// Every caller gives up as soon as the search for the cause begins. Each
// Publish returns at once with ErrNotConfirmed (or its outcome, if it came
// first), and the search sends none of their messages again after the round
// under way: it stops short of the three rounds 500 need.
func TestCallersThatGiveUpAreNotSearchedFurther(t *testing.T) {
	const inFlight = 500
	q, internal, _ := unpinnedFixture(t)
	proxy, url := brokertest.Proxy(t)
	p := newPublisher(t, url, publisher.WithChannels(1))
	proxy.SetLatency(10 * time.Millisecond) // a round long enough to give up in
	ctx, giveUp := context.WithCancel(context.Background())
	defer giveUp()
	watcher := make(chan struct{})
	go func() {
		defer close(watcher)
		deadline := time.Now().Add(20 * time.Second)
		for publisher.SuspectRounds(p) == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		giveUp()
	}()
	errs := badAmongMany(t, ctx, p, proxy, internal, q, inFlight, nil)
	<-watcher
	proxy.SetLatency(0)
	var chErr *publisher.ChannelError
	for i, err := range errs {
		if err != nil && !errors.Is(err, publisher.ErrNotConfirmed) && !(i == 0 && errors.As(err, &chErr)) {
			t.Errorf("publish %d: %v, want nil or ErrNotConfirmed", i, err)
		}
	}
	brokertest.Eventually(t, 20*time.Second, "the search to end", func() bool { return publisher.Searching(p) == 0 })
	if rounds := publisher.SuspectRounds(p); rounds >= 3 {
		t.Errorf("the search went on for %d rounds after every caller gave up", rounds)
	}
	if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte("after")}); err != nil {
		t.Fatal(err)
	}
}

// unpinnedFixture makes a queue q, an internal exchange (a publish to it
// makes the broker close the channel with a 403 whose text names no
// message in flight), and a channel ch to inspect them with.
func unpinnedFixture(t *testing.T) (q, internal string, ch *amqp.Channel) {
	t.Helper()
	q = brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	internal = brokertest.Name(t, "internal")
	ch = brokertest.Channel(t, brokertest.Dial(t))
	if err := ch.ExchangeDeclare(internal, "fanout", false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	return q, internal, ch
}
