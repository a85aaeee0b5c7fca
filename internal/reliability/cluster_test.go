//go:build cluster

package reliability

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/clustertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// clusterChildEnv tells a re-executed test binary to be one listener
// process: the work queue and the file it appends handled ids to.
const clusterChildEnv = "AMQPRETRY_CLUSTER_CHILD"

// What a message does in the cluster test, by a hash of its id as in the
// soak: healthy, transient (fails its first attempt of each delivery),
// permanent (straight to the DLQ) and, here, tiered: it fails every local
// attempt until it has been through a broker retry tier once.
func clusterFateOf(id string) fate {
	if f := fateOf(id); f != panics {
		return f
	}
	return tiered
}

const tiered = panics + 1

func clusterTopology(queue string) dlx.Topology {
	return dlx.Topology{
		Queue: queue, Type: dlx.Quorum, AtLeastOnce: true,
		RetryDelays: []time.Duration{500 * time.Millisecond, 2 * time.Second},
	}
}

// TestClusterZeroLoss runs three listener processes on a quorum topology of
// a three-node cluster while a publisher sends 20,000 messages with confirms
// across all nodes. Meanwhile the node leading the work queue is killed
// (SIGKILL of its beam) and started again, another node is cut off the
// network for 10 s and healed, and one listener process is SIGKILLed and
// replaced. At the end every id is handled or on the DLQ, exactly where its
// fate says, none is lost, and duplicates are counted.
func TestClusterZeroLoss(t *testing.T) {
	if spec := os.Getenv(clusterChildEnv); spec != "" {
		runClusterChild(t, spec)
		return
	}
	urls := clustertest.Require(t)
	messages := envInt("AMQPRETRY_CLUSTER_MESSAGES", 20000)
	book := newLogBook()
	quiet := book.logger()
	topo := clusterTopology(fmt.Sprintf("amqpretry-cluster-%d", time.Now().UnixNano()))
	declareOnCluster(t, urls, topo)

	dir := t.TempDir()
	children := &childSet{t: t, queue: topo.Queue, dir: dir, urls: urls}
	t.Cleanup(children.killAll)
	for range 3 {
		children.start()
	}

	var mu sync.Mutex
	dead := map[string]int{}
	dlqReader, err := listener.New(topo.DLQ(), nil, func(_ context.Context, d *amqp.Delivery) error {
		mu.Lock()
		dead[d.MessageId]++
		mu.Unlock()
		return nil
	}, listener.WithURLs(urls...), listener.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	source, err := publisher.New(urls[0], publisher.WithURLs(urls...), publisher.WithLogger(quiet), publisher.WithHeartbeat(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer source.Close()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			wg.Wait()
		}
	}
	defer stop()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := dlqReader.Run(ctx); err != nil {
			t.Error(err)
		}
	}()

	begin := time.Now()
	// Sixteen publishers share the ids, each publishing one until the
	// broker confirms it (a publish that fails with a node is sent again: a
	// duplicate at worst). One at a time, a quorum queue's confirm round trip
	// would set the pace.
	var confirmed, publishErrs atomic.Int64
	var lastPublishErr atomic.Value
	const publishers = 16
	for w := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < messages && ctx.Err() == nil; i += publishers {
				id := fmt.Sprint(i)
				for ctx.Err() == nil {
					pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
					err := source.Publish(pctx, "", topo.Queue, amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id)})
					pcancel()
					if err == nil {
						confirmed.Add(1)
						break
					}
					publishErrs.Add(1)
					lastPublishErr.Store(err.Error())
				}
			}
		}()
	}

	handledNow := func() int { return len(children.handled()) }
	accounted := func() int {
		h := children.handled()
		mu.Lock()
		defer mu.Unlock()
		n := len(h)
		for id := range dead {
			if h[id] == 0 {
				n++
			}
		}
		return n
	}
	waitFor := func(what string, timeout time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for !cond() {
			if time.Now().After(deadline) {
				var queues []string
				for _, node := range clustertest.Nodes {
					out, err := clustertest.Script()
					if err == nil {
						o, _ := exec.Command(out, "ctl", node, "-q", "-t", "10", "list_queues", "name", "leader", "members", "online", "messages").CombinedOutput()
						queues = append(queues, node+": "+string(o))
					}
				}
				stacks := make([]byte, 4<<20)
				stacks = stacks[:runtime.Stack(stacks, true)]
				dump := filepath.Join(os.TempDir(), fmt.Sprintf("amqpretry-cluster-stacks-%d.txt", os.Getpid()))
				_ = os.WriteFile(dump, stacks, 0o644)
				t.Logf("goroutines of this process: %s; %d failed publishes, the last: %v", dump, publishErrs.Load(), lastPublishErr.Load())
				t.Fatalf("%s: not within %v (%d confirmed, %d accounted for)\nqueues as the nodes see them:\n%s\nthis process:\n%s\nlistener processes:\n%s",
					what, timeout, confirmed.Load(), accounted(), strings.Join(queues, "\n"), book.all(), children.output())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	progress := func(share float64) func() bool {
		return func() bool { return confirmed.Load() >= int64(float64(messages)*share) && accounted() > 0 }
	}

	// 1. Kill the node that leads the work queue, start it again.
	waitFor("a fifth confirmed", 5*time.Minute, progress(0.2))
	leaderBefore := leaderOf(t, topo.Queue)
	atKill, nackedAtKill := handledNow(), publishErrs.Load()
	killed := time.Now()
	clustertest.Run(t, "kill", leaderBefore)
	leaderAfter := leaderOf(t, topo.Queue)
	elected := time.Since(killed)
	// Resumed: more handled than all the listeners' prefetch could hold at
	// the kill (3 processes × 4 consumers × 50), so the queue's new leader
	// is delivering again. RabbitMQ 3.10 sometimes nacks every publish to
	// the queue through the survivors until the old leader's node is back:
	// the test notes it and starts the node, which it does anyway.
	resumed := func() bool { return handledNow() >= atKill+700 }
	deadline := time.Now().Add(20 * time.Second)
	for !resumed() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	resumedWithoutIt := resumed()
	resumedAfter := time.Since(killed)
	if resumedWithoutIt {
		time.Sleep(3 * time.Second)
	}
	clustertest.Run(t, "start", leaderBefore)
	waitFor("consumption resumed", 2*time.Minute, resumed)
	if !resumedWithoutIt {
		resumedAfter = time.Since(killed)
	}
	nackedAfterKill := publishErrs.Load() - nackedAtKill

	// 2. Cut another node off the network for 10 s, then heal it.
	waitFor("two fifths confirmed", 5*time.Minute, progress(0.4))
	partitioned := ""
	for _, node := range clustertest.Nodes {
		if node != leaderAfter && node != leaderBefore {
			partitioned = node
		}
	}
	if partitioned == "" {
		partitioned = leaderBefore
	}
	leaderAtCut := leaderOf(t, topo.Queue)
	clustertest.Run(t, "partition", partitioned)
	time.Sleep(10 * time.Second)
	healing := time.Now()
	clustertest.Run(t, "heal", partitioned)
	// heal returns once the node is a running member again: a paused node
	// (3.10, 4.0) after it restarted, one that never paused (4.3) after it
	// reconnected. A node that held elections alone may take over on return.
	rejoined := time.Since(healing)
	leaderAtHeal := leaderOf(t, topo.Queue)

	// 3. SIGKILL a listener process and start another.
	waitFor("three fifths confirmed", 5*time.Minute, progress(0.6))
	children.killOne()
	children.start()

	waitFor("every message handled or dead-lettered", 10*time.Minute, func() bool { return accounted() == messages })
	took := time.Since(begin)
	time.Sleep(2 * time.Second) // stragglers: a redelivery, a late dead letter
	children.stopAll()
	stop()

	handled := children.handled()
	mu.Lock()
	defer mu.Unlock()
	dupHandled, dupDead := 0, 0
	for i := range messages {
		id := fmt.Sprint(i)
		f := clusterFateOf(id)
		inHandled, inDead := handled[id] > 0, dead[id] > 0
		switch {
		case !inHandled && !inDead:
			t.Errorf("message %s lost", id)
		case f == permanent && (!inDead || inHandled):
			t.Errorf("message %s (permanent) should be on the DLQ only: handled %d, dead %d", id, handled[id], dead[id])
		case f != permanent && (!inHandled || inDead):
			t.Errorf("message %s (fate %d) should be handled only: handled %d, dead %d", id, f, handled[id], dead[id])
		}
		dupHandled += max(handled[id]-1, 0)
		dupDead += max(dead[id]-1, 0)
	}
	if leaderAfter == leaderBefore {
		t.Errorf("the work queue's leader is still %s after it was killed", leaderBefore)
	}
	survivors := "on the survivors"
	if !resumedWithoutIt {
		survivors = "only once the killed node was back"
	}
	t.Logf("after the kill: new leader known within %v, consumption resumed after %v %s, %d publishes failed (nacked or unconfirmed) and were sent again",
		elected.Round(time.Millisecond), resumedAfter.Round(time.Millisecond), survivors, nackedAfterKill)
	t.Logf("partition: %s cut off for 10s, a member again %v after the heal; the work queue was led by %s at the cut and by %s after the heal",
		partitioned, rejoined.Round(time.Millisecond), leaderAtCut, leaderAtHeal)
	t.Logf("%d messages in %v on %d nodes: %d handled, %d dead-lettered, 0 lost; leader %s killed (new leader %s, consumption resumed after %v), %s partitioned for 10s, 1 of %d listener processes SIGKILLed; duplicates: %d handled twice, %d dead-lettered twice (%.1f per 1000)",
		messages, took.Round(time.Millisecond), len(urls), len(handled), len(dead), leaderBefore, leaderAfter, resumedAfter.Round(time.Millisecond),
		partitioned, children.started, dupHandled, dupDead, float64(dupHandled+dupDead)*1000/float64(messages))
}

// leaderOf waits out an election: the node that leads queue.
func leaderOf(t *testing.T, queue string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if leader := clustertest.Leader(t, queue); leader != "" {
			return leader
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has had no leader for a minute", queue)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// declareOnCluster declares the topology through one of the nodes.
func declareOnCluster(t *testing.T, urls []string, topo dlx.Topology) {
	t.Helper()
	conn, err := amqp.Dial(urls[0])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := topo.Declare(ch); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := amqp.Dial(urls[len(urls)-1])
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		for _, q := range append([]string{topo.Queue, topo.DLQ()}, retryQueues(topo)...) {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = ch.ExchangeDelete(topo.DLX(), false, false)
	})
}

func retryQueues(topo dlx.Topology) []string {
	var qs []string
	for _, d := range topo.RetryDelays {
		qs = append(qs, topo.RetryQueue(d))
	}
	return qs
}

// childSet owns the listener processes: each appends the ids it handled to
// a file of its own, which survives its SIGKILL.
type childSet struct {
	t       *testing.T
	queue   string
	dir     string
	urls    []string
	mu      sync.Mutex
	running []*exec.Cmd
	started int
	outMu   sync.Mutex
	out     []string
	readers sync.WaitGroup
}

func (c *childSet) start() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started++
	file := filepath.Join(c.dir, fmt.Sprintf("handled-%d", c.started))
	cmd := exec.Command(os.Args[0], "-test.run=^TestClusterZeroLoss$", "-test.v")
	cmd.Env = append(os.Environ(), clusterChildEnv+"="+c.queue+","+file, clustertest.URLsEnv+"="+strings.Join(c.urls, ","))
	out, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	n := c.started
	c.readers.Add(1)
	go func() {
		defer c.readers.Done()
		s := bufio.NewScanner(out)
		for s.Scan() {
			c.outMu.Lock()
			c.out = append(c.out, fmt.Sprintf("child %d: %s", n, s.Text()))
			c.outMu.Unlock()
		}
	}()
	c.running = append(c.running, cmd)
}

// killOne SIGKILLs the oldest listener process.
func (c *childSet) killOne() {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := c.running[0]
	c.running = c.running[1:]
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// stopAll ends the listener processes gracefully (SIGTERM) and waits.
func (c *childSet) stopAll() {
	c.mu.Lock()
	running := c.running
	c.running = nil
	c.mu.Unlock()
	for _, cmd := range running {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, cmd := range running {
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				c.t.Errorf("a listener process did not shut down cleanly: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			c.t.Errorf("a listener process ignored SIGTERM for 30s")
		}
	}
	c.readers.Wait()
}

// killAll is the cleanup: no process outlives the test, whatever happened.
func (c *childSet) killAll() {
	c.mu.Lock()
	running := c.running
	c.running = nil
	c.mu.Unlock()
	for _, cmd := range running {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	c.readers.Wait()
}

// handled counts, per id, the handled records of every process so far.
func (c *childSet) handled() map[string]int {
	files, _ := filepath.Glob(filepath.Join(c.dir, "handled-*"))
	counts := map[string]int{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(string(data), "\n")
		for _, id := range lines[:len(lines)-1] { // the last line may be half written
			counts[id]++
		}
	}
	return counts
}

func (c *childSet) output() string {
	c.outMu.Lock()
	defer c.outMu.Unlock()
	return strings.Join(c.out[max(len(c.out)-60, 0):], "\n")
}

// runClusterChild is one listener process: Retry(3) locally, then the
// topology's tiers, then the DLQ; each id it handles is appended to its file
// before the ack, so a SIGKILL between the two shows as a duplicate, never a
// loss.
func runClusterChild(t *testing.T, spec string) {
	queue, file, _ := strings.Cut(spec, ",")
	urls := clustertest.Require(t)
	topo := clusterTopology(queue)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	record, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer record.Close()
	pub, err := publisher.New(urls[0], publisher.WithURLs(urls...), publisher.WithHeartbeat(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var mu sync.Mutex
	handle := func(ctx context.Context, d *amqp.Delivery) error {
		switch clusterFateOf(d.MessageId) {
		case transient:
			if middleware.Attempt(ctx) == 1 {
				return errors.New("transient")
			}
		case permanent:
			return middleware.Permanent(errors.New("permanent"))
		case tiered:
			if topo.RetryCount(d) == 0 {
				return errors.New("needs a broker retry")
			}
		}
		mu.Lock()
		defer mu.Unlock()
		_, err := record.WriteString(d.MessageId + "\n")
		return err
	}
	l, err := listener.New(queue,
		middleware.Chain(
			middleware.Retry(3, middleware.WithInitialInterval(10*time.Millisecond), middleware.WithMaxInterval(100*time.Millisecond)),
			middleware.Recover(topo.Tiers(pub, dlx.MaxRetries(3)))),
		handle, listener.WithURLs(urls...), listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(4),
		listener.WithPrefetch(50), listener.WithHeartbeat(2*time.Second), listener.WithRequeueDelay(50*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClusterThroughput measures, in one run, a quorum queue on the cluster
// against a quorum queue on the single broker $AMQP_URL names: 10,000
// messages published with confirms by 16 goroutines, then consumed by a
// listener with two consumers. It reports; it asserts nothing about speed.
func TestClusterThroughput(t *testing.T) {
	urls := clustertest.Require(t)
	brokertest.Dial(t)
	const n = 10000
	type result struct{ publish, consume float64 }
	measure := func(name string, urls []string) result {
		queue := fmt.Sprintf("amqpretry-throughput-%s-%d", name, time.Now().UnixNano())
		conn, err := amqp.Dial(urls[0])
		if err != nil {
			t.Fatal(err)
		}
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = ch.QueueDelete(queue, false, false, false); _ = conn.Close() }()
		pub, err := publisher.New(urls[0], publisher.WithURLs(urls...), publisher.WithLogger(newLogBook().logger()))
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		begin := time.Now()
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 16 {
					if err := pub.Publish(context.Background(), "", queue, amqp.Publishing{MessageId: fmt.Sprint(i), DeliveryMode: amqp.Persistent}); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		published := time.Since(begin)
		var handled atomic.Int64
		l, err := listener.New(queue, middleware.Chain(middleware.Retry(3), middleware.Recover(recoverer.Requeue())), func(context.Context, *amqp.Delivery) error { handled.Add(1); return nil },
			listener.WithURLs(urls...), listener.WithConcurrentConsumers(2), listener.WithLogger(newLogBook().logger()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		begin = time.Now()
		go func() { done <- l.Run(ctx) }()
		for handled.Load() < n && time.Since(begin) < 2*time.Minute {
			time.Sleep(5 * time.Millisecond)
		}
		consumed := time.Since(begin)
		cancel()
		if err := <-done; err != nil || handled.Load() < n {
			t.Fatalf("%s: consumed %d of %d (%v)", name, handled.Load(), n, err)
		}
		return result{n / published.Seconds(), n / consumed.Seconds()}
	}
	cluster := measure("cluster", urls)
	single := measure("single", []string{brokertest.URL()})
	t.Logf("quorum queue, %d messages: publish (confirmed, 16 goroutines) %.0f msg/s on the cluster vs %.0f on one node (%.2f); consume (listener, 2 consumers) %.0f vs %.0f msg/s (%.2f)",
		n, cluster.publish, single.publish, cluster.publish/single.publish, cluster.consume, single.consume, cluster.consume/single.consume)
}
