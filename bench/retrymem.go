package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
)

// parkDelay is how long a parked message waits: long enough that none comes
// back while the rest are still being parked and measured. What a waiting
// message costs the broker does not depend on how long it waits.
const parkDelay = 60 * time.Second

// parkedStatsWait bounds the wait for rabbitmqctl's counts to show every
// message parked: the broker refreshes them every few seconds (5 s by
// default).
const parkedStatsWait = 30 * time.Second

// ParkedMemory is what the broker holds for messages waiting out a long
// delay: in the work queue itself (delayed retry) or as republished copies
// in a TTL tier queue.
type ParkedMemory struct {
	Messages     int     `json:"messages"`
	DelaySeconds float64 `json:"delay_seconds"`
	// Ctl is the rabbitmqctl command the queue memory came from; CtlError
	// says why there is none.
	Ctl      string          `json:"ctl"`
	CtlError string          `json:"ctl_error,omitempty"`
	Variants []ParkedVariant `json:"variants"`
}

// ParkedVariant is one way of parking the messages. Memory is in bytes, -1
// when unknown, each with the topology declared and empty (before) and with
// every message parked (after): the queues' as rabbitmqctl list_queues
// reports it (summed over the topology's queues), the Erlang VM's
// (erlang:memory(total), what the node has allocated) and the broker
// process's resident set (VmRSS, which also holds what the VM's allocators
// keep after freeing it).
type ParkedVariant struct {
	Name              string           `json:"name"`
	About             string           `json:"about"`
	ParkSeconds       float64          `json:"park_seconds"` // from the first delivery to the last message parked
	QueueMemoryBefore int64            `json:"queue_memory_before"`
	QueueMemoryAfter  int64            `json:"queue_memory_after"`
	QueuesAfter       map[string]int64 `json:"queue_memory_after_by_queue,omitempty"`
	NodeMemoryBefore  int64            `json:"node_memory_before"`
	NodeMemoryAfter   int64            `json:"node_memory_after"`
	RSSBefore         int64            `json:"broker_rss_before"`
	RSSAfter          int64            `json:"broker_rss_after"`
}

// parkedWay is how a variant parks its messages: the layout, the chain
// (given a publisher) and whether a listing shows them all parked.
type parkedWay struct {
	name, about string
	topology    func(q string) dlx.Topology
	chain       func(topo dlx.Topology, pub *publisher.Publisher, parked func()) middleware.Middleware
	allParked   func(topo dlx.Topology, n int, queues map[string]queueStats) bool
}

func parkedWays() []parkedWay {
	delayed := func(q string) dlx.Topology {
		return dlx.Topology{Queue: q, Type: dlx.Quorum, DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 1, Min: parkDelay, Max: parkDelay}}
	}
	return []parkedWay{
		{name: "delayed",
			about: fmt.Sprintf("listener, Chain(Recover(topo.Redeliver(pub))) on DelayedRedelivery{Redeliveries: 1, Min: %v, Max: %v}, the handler failing: "+
				"each message rejected once and held in the work queue", parkDelay, parkDelay),
			topology: delayed,
			chain: func(topo dlx.Topology, pub *publisher.Publisher, parked func()) middleware.Middleware {
				return middleware.Chain(middleware.Recover(counting(topo.Redeliver(pub), parked, middleware.ErrRedeliver)))
			},
			// Held messages count in messages, but neither ready nor unacked.
			allParked: func(topo dlx.Topology, n int, queues map[string]queueStats) bool {
				s, ok := queues[topo.Queue]
				return ok && s.Messages == int64(n) && s.Ready == 0 && s.Unacked == 0
			},
		},
		{name: "tiers",
			about: fmt.Sprintf("listener, Chain(Recover(topo.Tiers(pub, dlx.MaxRetries(1)))) on the same topology's TierEquivalent(), the handler failing: "+
				"each message republished with its fault headers to the %v TTL tier (quorum), confirmed, and acked", parkDelay),
			topology: func(q string) dlx.Topology { return delayed(q).TierEquivalent() },
			chain: func(topo dlx.Topology, pub *publisher.Publisher, parked func()) middleware.Middleware {
				return middleware.Chain(middleware.Recover(counting(topo.Tiers(pub, dlx.MaxRetries(1)), parked, nil)))
			},
			allParked: func(topo dlx.Topology, n int, queues map[string]queueStats) bool {
				work, tier := queues[topo.Queue], queues[topo.RetryQueue(parkDelay)]
				return tier.Messages == int64(n) && work.Messages == 0
			},
		},
	}
}

// counting wraps a recoverer to call parked each time it answers with want
// (nil: succeeds).
func counting(r middleware.Recoverer, parked func(), want error) middleware.Recoverer {
	return middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
		err := r.Recover(ctx, d, cause)
		if want == nil && err == nil || want != nil && errors.Is(err, want) {
			parked()
		}
		return err
	})
}

// measureParked parks cfg.RetryParked messages each way, one way after the
// other, and notes the queues' memory and the broker's before and after.
func measureParked(ctx context.Context, e *env) (*ParkedMemory, error) {
	res := &ParkedMemory{Messages: e.cfg.RetryParked, DelaySeconds: parkDelay.Seconds(), Ctl: e.cfg.RetryCtl}
	ctl := strings.Fields(e.cfg.RetryCtl)
	if len(ctl) == 0 {
		res.CtlError = "no -retry-ctl command"
	}
	for _, way := range parkedWays() {
		v, err := parkOnce(ctx, e, way, ctl, res)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", way.name, err)
		}
		e.cfg.logf("retry parked %-8s %d messages in %.1fs: queues %s → %s, broker RSS %s → %s", way.name, res.Messages, v.ParkSeconds,
			bytesText(v.QueueMemoryBefore), bytesText(v.QueueMemoryAfter), bytesText(v.RSSBefore), bytesText(v.RSSAfter))
		res.Variants = append(res.Variants, v)
	}
	return res, nil
}

// parkOnce declares way's topology, notes the memory, fills its work queue,
// lets a listener park every message, waits until the broker's counts show
// them all parked, notes the memory again and deletes everything.
func parkOnce(ctx context.Context, e *env, way parkedWay, ctl []string, res *ParkedMemory) (v ParkedVariant, err error) {
	n := res.Messages
	v = ParkedVariant{Name: way.name, About: way.about, QueueMemoryBefore: -1, QueueMemoryAfter: -1, NodeMemoryBefore: -1, NodeMemoryAfter: -1}
	topo := way.topology(uniqueName("parked." + way.name))
	cleanup, err := declareTopology(e.broker, topo)
	if err != nil {
		return v, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	names := []string{topo.Queue, topo.DLQ()}
	for _, d := range topo.RetryDelays {
		names = append(names, topo.RetryQueue(d))
	}
	// memory lists the queues, and sums theirs if the listing has them all.
	memory := func() (map[string]queueStats, int64) {
		if res.CtlError != "" {
			return nil, -1
		}
		queues, err := listQueues(ctx, ctl)
		if err != nil {
			res.CtlError = err.Error()
			return nil, -1
		}
		return queues, sumMemory(queues, names)
	}
	node := func() int64 {
		if res.CtlError != "" {
			return -1
		}
		n, err := nodeMemory(ctx, ctl)
		if err != nil {
			res.CtlError = err.Error()
			return -1
		}
		return n
	}
	_, v.QueueMemoryBefore = memory()
	v.NodeMemoryBefore, v.RSSBefore = node(), processRSS(e.brokerPID)

	if err := e.broker.fillIDs(ctx, topo.Queue, n); err != nil {
		return v, err
	}
	t := newTally(n)
	handle := func(context.Context, *amqp.Delivery) error {
		t.begin()
		return errFlaky
	}
	c, err := runListener(ctx, e, topo.Queue, func(pub *publisher.Publisher) middleware.Middleware {
		return way.chain(topo, pub, t.hit)
	}, handle)
	if err != nil {
		return v, err
	}
	err = t.wait(ctx)
	v.ParkSeconds = t.elapsed().Seconds()
	if err = errors.Join(err, c.stop()); err != nil {
		return v, err
	}

	// Every message is parked once the broker's counts say so; without
	// rabbitmqctl, a passive declare tells the tier's, and the work queue's
	// ready messages (which held ones are not).
	deadline := time.Now().Add(parkedStatsWait)
	for {
		var queues map[string]queueStats
		queues, v.QueueMemoryAfter = memory()
		if queues != nil {
			if way.allParked(topo, n, queues) {
				v.QueuesAfter = map[string]int64{}
				for _, name := range names {
					v.QueuesAfter[name] = queues[name].Memory
				}
				break
			}
		} else if parked, err := parkedByDeclare(e.broker, topo, n); err != nil {
			return v, err
		} else if parked {
			break
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("the broker did not show %d messages parked within %v of the last one (%s): "+
				"if parking took longer than the %v delay, some came back", n, parkedStatsWait, queueCounts(queues, names), parkDelay)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return v, err
		}
	}
	v.NodeMemoryAfter, v.RSSAfter = node(), processRSS(e.brokerPID)
	return v, nil
}

// parkedByDeclare is allParked from passive declares: the tier holds n
// ready messages, or the delayed-retry work queue none (it counts the
// messages it holds as neither ready nor unacked).
func parkedByDeclare(b *broker, topo dlx.Topology, n int) (bool, error) {
	if len(topo.RetryDelays) > 0 {
		q, err := b.inspect(topo.RetryQueue(topo.RetryDelays[0]))
		return err == nil && q.Messages == n, err
	}
	q, err := b.inspect(topo.Queue)
	return err == nil && q.Messages == 0, err
}

// queueStats is one line of rabbitmqctl list_queues name messages
// messages_ready messages_unacknowledged memory. A count the broker has not
// reported yet (a new quorum queue's) is -1.
type queueStats struct {
	Messages, Ready, Unacked, Memory int64
}

// listQueueColumns are the columns listQueues asks for, in parseQueueList's
// order.
var listQueueColumns = []string{"name", "messages", "messages_ready", "messages_unacknowledged", "memory"}

// listQueues runs ctl list_queues (ctl is the command that reaches the node,
// "scripts/rabbit4.sh 4.3 ctl" or "rabbitmqctl -n rabbit@host") and parses it.
func listQueues(ctx context.Context, ctl []string) (map[string]queueStats, error) {
	out, err := runCtl(ctx, ctl, append([]string{"list_queues", "-q", "--no-table-headers"}, listQueueColumns...)...)
	if err != nil {
		return nil, err
	}
	return parseQueueList(out), nil
}

// nodeMemory is what the node's Erlang VM has allocated, erlang:memory(total).
func nodeMemory(ctx context.Context, ctl []string) (int64, error) {
	out, err := runCtl(ctx, ctl, "eval", "-q", "erlang:memory(total).")
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s eval erlang:memory(total). printed %q, not a byte count", strings.Join(ctl, " "), out)
	}
	return n, nil
}

// runCtl runs the ctl command with args and returns what it printed.
func runCtl(ctx context.Context, ctl []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, ctl[0], append(ctl[1:len(ctl):len(ctl)], args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", strings.Join(ctl, " "), args[0], err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// parseQueueList reads list_queues' tab-separated lines of name, messages,
// messages_ready, messages_unacknowledged and memory. Lines that are not
// such (a header, a warning) are left out; an empty count is -1.
func parseQueueList(out string) map[string]queueStats {
	queues := map[string]queueStats{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimRight(line, "\r"), "\t")
		if len(f) < len(listQueueColumns) {
			continue
		}
		// The name may hold a tab; the four counts are the last fields.
		counts := f[len(f)-4:]
		var n [4]int64
		ok := true
		for i, c := range counts {
			c = strings.TrimSpace(c)
			if c == "" {
				n[i] = -1
				continue
			}
			v, err := strconv.ParseInt(c, 10, 64)
			if err != nil {
				ok = false
				break
			}
			n[i] = v
		}
		if !ok {
			continue
		}
		queues[strings.Join(f[:len(f)-4], "\t")] = queueStats{Messages: n[0], Ready: n[1], Unacked: n[2], Memory: n[3]}
	}
	return queues
}

// sumMemory is the memory of the named queues together, or -1 when the
// listing lacks one or its memory.
func sumMemory(queues map[string]queueStats, names []string) int64 {
	var sum int64
	for _, name := range names {
		s, ok := queues[name]
		if !ok || s.Memory < 0 {
			return -1
		}
		sum += s.Memory
	}
	return sum
}

// queueCounts says what a listing showed of the named queues, for an error.
func queueCounts(queues map[string]queueStats, names []string) string {
	if queues == nil {
		return "no rabbitmqctl listing"
	}
	var parts []string
	for _, name := range names {
		s := queues[name]
		parts = append(parts, fmt.Sprintf("%s: %d messages, %d ready, %d unacked", name, s.Messages, s.Ready, s.Unacked))
	}
	return strings.Join(parts, "; ")
}

// processRSS is process pid's resident set in bytes, from /proc/<pid>/status,
// or -1 when it cannot be read.
func processRSS(pid int) int64 {
	if pid <= 0 {
		return -1
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	if rss, ok := parseVmRSS(string(data)); ok {
		return rss
	}
	return -1
}

// parseVmRSS reads the VmRSS line of /proc/<pid>/status ("VmRSS:	  123456 kB").
func parseVmRSS(status string) (int64, bool) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return 0, false
		}
		return kb * 1024, true
	}
	return 0, false
}

// bytesText writes a byte count for people: 512 B, 14.2 KiB, 301.5 MiB; a
// dash when unknown (negative).
func bytesText(n int64) string {
	switch {
	case n < 0:
		return "–"
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1024*1024:
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	case n < 1024*1024*1024:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1024*1024))
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(1024*1024*1024))
}
