package listener

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// modelChannel is an amqp.Acknowledger that settles as RabbitMQ does and
// fails the test where the broker would close the channel or where a
// settlement would be wrong: an ack or a reject of a tag that is not
// unsettled (406 unknown delivery tag), and an ack, multiple or not, of a
// delivery the test has not marked handled. It records what was written.
type modelChannel struct {
	t         testing.TB
	mu        sync.Mutex
	unsettled map[uint64]bool // tag → handled
	calls     []string
	fail      error // every call fails with it (a closed channel)
}

func newModel(t testing.TB) *modelChannel {
	return &modelChannel{t: t, unsettled: map[uint64]bool{}}
}

func (m *modelChannel) deliver(tag uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unsettled[tag] = false
}

func (m *modelChannel) handled(tag uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.unsettled[tag]; ok {
		m.unsettled[tag] = true
	}
}

func (m *modelChannel) take(tag uint64, what string) bool {
	if _, ok := m.unsettled[tag]; !ok {
		m.t.Errorf("%s: PRECONDITION_FAILED - unknown delivery tag %d", what, tag)
		return false
	}
	return true
}

func (m *modelChannel) Ack(tag uint64, multiple bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	what := "ack " + strconv.FormatUint(tag, 10)
	if multiple {
		what += " multiple"
	}
	m.calls = append(m.calls, what)
	if !m.take(tag, what) {
		return nil
	}
	for k, handled := range m.unsettled {
		if k == tag || multiple && k < tag {
			if !handled {
				m.t.Errorf("%s acks delivery %d, which was not handled", what, k)
			}
			delete(m.unsettled, k)
		}
	}
	return nil
}

func (m *modelChannel) settleAlone(tag uint64, what string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.calls = append(m.calls, what)
	if m.take(tag, what) {
		delete(m.unsettled, tag)
	}
	return nil
}

func (m *modelChannel) Nack(tag uint64, multiple, requeue bool) error {
	if multiple || !requeue {
		m.t.Errorf("nack %d multiple=%v requeue=%v: the listener nacks one delivery, to requeue it", tag, multiple, requeue)
	}
	return m.settleAlone(tag, fmt.Sprint("nack ", tag))
}

func (m *modelChannel) Reject(tag uint64, requeue bool) error {
	what := fmt.Sprint("reject ", tag)
	if requeue {
		what += " requeue"
	}
	return m.settleAlone(tag, what)
}

// waitingAcks is how many handled deliveries are unsettled.
func (m *modelChannel) waitingAcks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, handled := range m.unsettled {
		if handled {
			n++
		}
	}
	return n
}

func (m *modelChannel) written() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// rig is a settler on a model channel, with a clock of its own and no
// flusher: flushDue runs when a step says so.
type rig struct {
	s     *settler
	m     *modelChannel
	acked atomic.Uint64
	lost  int
	clock int64
}

func newRig(t testing.TB, maxAcks int, delay time.Duration) *rig {
	r := &rig{m: newModel(t)}
	r.s = newSettler(r.m, &r.acked, maxAcks, delay, func(n int, _ error) { r.lost += n })
	r.s.now = func() int64 { return r.clock }
	return r
}

// do runs one step of a script:
//
//	r1-5   receive tags 1 to 5 (r7: tag 7)
//	a3     settle 3 handled (an ack)
//	q3     settle 3 as a failure to requeue (x3: reject, n3: release)
//	f3     forget 3
//	+40    advance the clock 40ms and run what the timer would
//	close  close, writing what waits; drop: close without writing
//	abandon, down: every later write fails (a closed channel)
func (r *rig) do(t *testing.T, step string) {
	t.Helper()
	tagOf := func(s string) uint64 {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("step %q: %v", step, err)
		}
		return n
	}
	switch {
	case step == "close":
		r.s.close(true)
	case step == "drop":
		r.s.close(false)
	case step == "abandon":
		r.s.abandon()
	case step == "down":
		r.m.fail = errors.New("channel/connection is not open")
	case step[0] == '+':
		r.clock += int64(time.Duration(tagOf(step[1:])) * time.Millisecond)
		r.s.flushDue()
	case step[0] == 'r':
		from, to, ok := strings.Cut(step[1:], "-")
		if !ok {
			to = from
		}
		for tag := tagOf(from); tag <= tagOf(to); tag++ {
			r.m.deliver(tag)
			r.s.received(tag)
		}
	case step[0] == 'f':
		tag := tagOf(step[1:])
		r.s.forget(tag)
		r.m.mu.Lock()
		delete(r.m.unsettled, tag) // the broker took it back
		r.m.mu.Unlock()
	default:
		tag := tagOf(step[1:])
		how := map[byte]chainrun.Settlement{'a': chainrun.Ack, 'q': chainrun.Requeue, 'x': chainrun.Reject, 'n': chainrun.Release}[step[0]]
		if how == chainrun.Ack {
			r.m.handled(tag)
		}
		if err := r.s.settle(tag, how); err != nil && r.m.fail == nil && !errors.Is(err, errAbandoned) {
			t.Errorf("step %q: %v", step, err)
		}
	}
}

func TestSettlerCoalescesTheHandledPrefix(t *testing.T) {
	for _, tc := range []struct {
		name   string
		max    int
		script string
		want   string // what was written, ";"-separated
		acked  uint64
		lost   int
	}{
		{name: "in order, the count writes one multiple ack",
			max: 4, script: "r1-9 a1 a2 a3 a4 a5 a6 a7 a8 a9 close",
			want: "ack 4 multiple; ack 8 multiple; ack 9", acked: 9},
		{name: "out of order: the prefix waits for the delivery in flight",
			max: 10, script: "r1-5 a2 a3 a1 close",
			want: "ack 3 multiple", acked: 3},
		{name: "the count comes with a delivery in flight below: those behind it go alone",
			max: 3, script: "r1-5 a2 a3 a4 a1 a5 close",
			want: "ack 2; ack 3; ack 4; ack 5 multiple", acked: 5},
		{name: "the count comes with a run below the delivery in flight",
			max: 4, script: "r1-6 a1 a2 a4 a5 a3 a6 close",
			want: "ack 2 multiple; ack 4; ack 5; ack 6 multiple", acked: 6},
		{name: "a failure in the middle: the prefix below it first, then it alone",
			max: 10, script: "r1-5 a1 a2 q3 a4 a5 close",
			want: "ack 2 multiple; reject 3 requeue; ack 5 multiple", acked: 4},
		{name: "a failure first: alone, and the run after it skips it",
			max: 3, script: "r1-4 x1 a2 a3 a4",
			want: "reject 1; ack 4 multiple", acked: 3},
		{name: "a failure while one below is in flight: nothing covers either",
			max: 10, script: "r1-4 a2 n3 a4 a1 close",
			want: "nack 3; ack 4 multiple", acked: 3},
		{name: "a failure completes after handled deliveries above it",
			max: 10, script: "r1-4 a2 a3 a4 x1 close",
			want: "reject 1; ack 4 multiple", acked: 3},
		{name: "the delay writes what waits; a run of one is a plain ack",
			max: 10, script: "r1-3 a1 +49 a2 +1 a3 +49 +1",
			want: "ack 2 multiple; ack 3", acked: 3},
		{name: "the delay counts from the first waiting ack, not the last",
			max: 10, script: "r1-3 +30 a1 +30 a2 +19 a3 +1",
			want: "ack 3 multiple", acked: 3},
		{name: "the delay writes those behind a delivery in flight alone",
			max: 10, script: "r1-4 a1 a3 a4 +50 a2 +50",
			want: "ack 1; ack 3; ack 4; ack 2", acked: 4},
		{name: "a forgotten delivery (taken back by the broker) leaves the prefix",
			max: 10, script: "r1-3 f1 a2 a3 close",
			want: "ack 3 multiple", acked: 2},
		{name: "close on a lost channel writes nothing and says what was lost",
			max: 10, script: "r1-3 a1 a2 a3 drop",
			want: "", acked: 0, lost: 3},
		{name: "a write that fails loses the acks it carried",
			max: 3, script: "r1-3 a1 a2 down a3",
			want: "", acked: 0, lost: 3},
		{name: "abandoned: what waits is dropped and nothing more is written",
			max: 10, script: "r1-4 a1 a2 abandon a3 x4 close",
			want: "", acked: 0},
		{name: "max 1 (prefetch 1): each at once",
			max: 1, script: "r1-3 a1 q2 a3",
			want: "ack 1; reject 2 requeue; ack 3", acked: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.max, 50*time.Millisecond)
			for _, step := range strings.Fields(tc.script) {
				r.do(t, step)
			}
			if got := strings.Join(r.m.written(), "; "); got != tc.want {
				t.Errorf("wrote %q\nwant  %q", got, tc.want)
			}
			if got := r.acked.Load(); got != tc.acked {
				t.Errorf("acked (Stats().Handled) %d, want %d", got, tc.acked)
			}
			if r.lost != tc.lost {
				t.Errorf("lost %d acks, want %d", r.lost, tc.lost)
			}
		})
	}
}

// Random completions, in any order, of deliveries received in bursts: the
// model channel fails the test on any ack that covers an unhandled or
// failed delivery or names a settled one; at most max-1 acks wait after
// each step, none past the delay, and at the close every delivery is
// settled and every handled one acked.
func TestSettlerRandomOrders(t *testing.T) {
	const delay = 50 * time.Millisecond
	for seed := range uint64(300) {
		rnd := rand.New(rand.NewPCG(seed, 28))
		maxAcks := 2 + rnd.IntN(20)
		r := newRig(t, maxAcks, delay)
		var next uint64 = 1
		var inFlight []uint64
		handled := 0
		for range 400 {
			switch k := rnd.IntN(10); {
			case k < 3 || len(inFlight) == 0: // a burst arrives
				for range 1 + rnd.IntN(8) {
					r.m.deliver(next)
					r.s.received(next)
					inFlight = append(inFlight, next)
					next++
				}
			case k < 9: // one completes, mostly the newest (the reader's), sometimes any (a parked one)
				i := len(inFlight) - 1
				if rnd.IntN(4) == 0 {
					i = rnd.IntN(len(inFlight))
				}
				tag := inFlight[i]
				inFlight = slices.Delete(inFlight, i, i+1)
				switch o := rnd.IntN(20); {
				case o == 0:
					r.s.forget(tag)
					r.m.mu.Lock()
					delete(r.m.unsettled, tag) // the broker took it back
					r.m.mu.Unlock()
				case o < 3:
					_ = r.s.settle(tag, []chainrun.Settlement{chainrun.Requeue, chainrun.Reject, chainrun.Release}[rnd.IntN(3)])
				default:
					r.m.handled(tag)
					handled++
					_ = r.s.settle(tag, chainrun.Ack)
				}
			default: // time passes
				r.clock += int64(time.Duration(rnd.IntN(60)) * time.Millisecond)
				r.s.flushDue()
			}
			if n := r.m.waitingAcks(); n >= maxAcks {
				t.Fatalf("seed %d: %d acks wait, max %d", seed, n, maxAcks)
			}
			if r.s.waiting > 0 && time.Duration(r.clock-r.s.since) >= delay {
				t.Fatalf("seed %d: acks wait %v, past the delay", seed, time.Duration(r.clock-r.s.since))
			}
			if t.Failed() {
				t.Fatalf("seed %d: %v", seed, r.m.written())
			}
		}
		for _, tag := range inFlight {
			r.m.handled(tag)
			handled++
			_ = r.s.settle(tag, chainrun.Ack)
		}
		r.s.close(true)
		if len(r.m.unsettled) != 0 || r.acked.Load() != uint64(handled) {
			t.Fatalf("seed %d: after close %d unsettled, %d acked of %d handled", seed, len(r.m.unsettled), r.acked.Load(), handled)
		}
		if n := len(r.s.out); n != 0 {
			t.Fatalf("seed %d: %d still tracked", seed, n)
		}
	}
}

// The flusher writes what waits once the delay has passed, on its own, and
// ends with close (goleak checks it).
func TestSettlerFlusherWritesAfterTheDelay(t *testing.T) {
	m := newModel(t)
	var acked atomic.Uint64
	s := newSettler(m, &acked, 100, 20*time.Millisecond, nil)
	var wg sync.WaitGroup
	s.start(&wg)
	for tag := uint64(1); tag <= 3; tag++ {
		m.deliver(tag)
		s.received(tag)
		m.handled(tag)
		if err := s.settle(tag, chainrun.Ack); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for acked.Load() != 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := m.written(); !slices.Equal(got, []string{"ack 3 multiple"}) {
		t.Errorf("wrote %q, want one multiple ack of 3", got)
	}
	s.close(true)
	wg.Wait()
}

// BenchmarkSettler is the settler's cost per delivery handled in order,
// against settling each at once.
func BenchmarkSettler(b *testing.B) {
	for _, maxAcks := range []int{1, 62} {
		b.Run(fmt.Sprint("max-", maxAcks), func(b *testing.B) {
			var acked atomic.Uint64
			s := newSettler(nopAck{}, &acked, maxAcks, time.Second, nil)
			var wg sync.WaitGroup
			s.start(&wg)
			b.ReportAllocs()
			tag := uint64(0)
			for b.Loop() {
				tag++
				s.received(tag)
				_ = s.settle(tag, chainrun.Ack)
			}
			s.close(true)
			wg.Wait()
		})
	}
}

// Every message allocates a delivery: it fits Go's 384-byte size class
// (448 before what only some deliveries need moved out of it), and GC work
// grows with every byte.
func TestDeliveryFitsItsSizeClass(t *testing.T) {
	if size := unsafe.Sizeof(delivery{}); size > 384 {
		t.Errorf("a delivery is %d bytes, more than the 384 of its size class: move what few deliveries need behind a pointer", size)
	}
}
