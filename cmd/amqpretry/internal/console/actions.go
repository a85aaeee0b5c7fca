package console

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/deadletter"
	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/recoverer"
)

// Destination is where a replay sends messages.
type Destination struct {
	// Kind is "original" (the queue each message failed on, the default),
	// "exchange" (the exchange and routing key each was first published
	// with) or "queue" (Queue, through the default exchange).
	Kind  string
	Queue string
}

func (d Destination) String() string {
	switch d.Kind {
	case "exchange":
		return "their original exchange and routing key"
	case "queue":
		return "queue " + d.Queue
	}
	return "their original queue"
}

func (d Destination) option() (dlx.ReplayOption, error) {
	switch d.Kind {
	case "", "original":
		return nil, nil
	case "exchange":
		return dlx.ReplayToOriginalExchange(), nil
	case "queue":
		if d.Queue == "" {
			return nil, errors.New("name the queue to replay to")
		}
		return dlx.ReplayTo(d.Queue), nil
	}
	return nil, fmt.Errorf("unknown destination %q", d.Kind)
}

// Outcome is what an action did, for the page and the audit log.
type Outcome struct {
	Action      string // replay, edit (an edited replay), delete (to the archive), restore, purge, outbox-retry
	Queue       string
	Destination string
	Requested   int // messages (or rows) asked for; for a purge the queue's depth when it began
	Done        int // replayed, deleted, purged or retried
	// Left is how many of those asked for are still on the queue (-1:
	// unknown), Missing how many were no longer there when the action
	// looked.
	Left, Missing int
	NoDestination int // looked at, matched, left for want of a destination
	Depth         int // the queue's ready messages after the action; -1 unknown
	Err           error
	Time          time.Time
}

// Summary is the sentence the page shows: "replayed 412, 0 left".
func (o Outcome) Summary() string {
	var s string
	switch o.Action {
	case "replay":
		s = fmt.Sprintf("replayed %d, %d left", o.Done, max(o.Left, 0))
	case "edit":
		s = fmt.Sprintf("replayed %d edited, %d left", o.Done, max(o.Left, 0))
	case "delete":
		s = fmt.Sprintf("archived %d to %s, %d left", o.Done, ArchiveOf(o.Queue), max(o.Left, 0))
	case "restore":
		s = fmt.Sprintf("restored %d to the queue each was archived from, %d left", o.Done, max(o.Left, 0))
	case "purge":
		s = fmt.Sprintf("purged %d", o.Done)
	case "outbox-retry":
		return fmt.Sprintf("put %d failed row(s) back in flight; a running relay publishes them at once", o.Done)
	}
	if o.Queue != "" {
		s += " on " + o.Queue
	}
	if o.Missing > 0 {
		s += fmt.Sprintf("; %d no longer on the queue", o.Missing)
	}
	if o.NoDestination > 0 {
		s += fmt.Sprintf("; %d without a destination (no original queue recorded: choose a queue)", o.NoDestination)
	}
	if o.Depth >= 0 {
		s += fmt.Sprintf("; the queue holds %d now", o.Depth)
	}
	return s
}

// discard is the publisher of a purge: dlx.Replay hands it each message it
// matched and acks that message on the queue once Publish returns, so one
// cut off halfway leaves the rest where they were.
type discard struct{}

func (discard) Publish(context.Context, string, string, amqp.Publishing) error { return nil }
func (discard) FrameMax() int                                                  { return 0 }
func (discard) Username() string                                               { return "" }

var _ recoverer.Publisher = discard{}

// Selection is what an action takes from a queue: messages with the keys
// of Keys, at most as many of each as it says, and, with a Group, only
// messages of that group, so that a message of another group that shares a
// key (producers often use a business key as message id) stays where it is.
type Selection struct {
	Keys  map[string]int
	Group *Group
}

// GroupSelection selects every message of g.
func GroupSelection(g *Group) Selection { return Selection{Keys: g.Keys(), Group: g} }

// TickedSelection selects the messages of snap with the given keys, of
// group g unless g is nil: as many of each key as snap holds (of g), and at
// least one, so that a key no longer on the queue is reported missing.
func TickedSelection(snap *Snapshot, g *Group, keys []string) Selection {
	sel := Selection{Keys: make(map[string]int, len(keys)), Group: g}
	for _, k := range keys {
		n := 0
		for _, m := range snap.ByKey(k) {
			if sel.has(m) {
				n++
			}
		}
		sel.Keys[k] = max(1, n)
	}
	return sel
}

// Requested is how many messages sel asks for.
func (sel Selection) Requested() int {
	n := 0
	for _, c := range sel.Keys {
		n += c
	}
	return n
}

// has reports whether m is of sel's group (its key aside).
func (sel Selection) has(m *Message) bool { return sel.Group == nil || sel.Group.Has(m) }

// Digest names exactly what sel would take (its group, keys and counts): a
// confirmation carries it, and an action whose selection no longer has the
// same digest is refused.
func (sel Selection) Digest() string {
	h := sha256.New()
	if sel.Group != nil {
		fmt.Fprintf(h, "group %s %s;", sel.Group.By, sel.Group.ID)
	}
	for _, k := range sortedKeys(sel.Keys) {
		fmt.Fprintf(h, "%d:%s=%d;", len(k), k, sel.Keys[k])
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Replay replays the messages sel selects on queue to dest, through
// dlx.Replay: each is published, confirmed, then acked on queue. Each
// replayed message keeps its history (dlx.ReplayKeepHistory).
func (c *Console) Replay(ctx context.Context, queue string, sel Selection, dest Destination) Outcome {
	return c.move(ctx, "replay", queue, sel, dest, "", nil)
}

// Delete moves the messages sel selects on queue to its archive
// (ArchiveOf), through dlx.Replay: each is published with every header,
// stamped archived at, by who and from queue, confirmed, then acked on
// queue, so a delete loses nothing and Restore undoes it. The archive is
// declared first if it is not there (Config.ArchiveType). Only Purge
// deletes for good.
func (c *Console) Delete(ctx context.Context, queue string, sel Selection, who string) Outcome {
	return c.move(ctx, "delete", queue, sel, Destination{Kind: "queue", Queue: ArchiveOf(queue)}, who, nil)
}

// Restore moves the messages sel selects on an archive back to the queue
// each was archived from, without the archive's headers, through
// dlx.Replay: confirmed, then acked on the archive.
func (c *Console) Restore(ctx context.Context, archive string, sel Selection) Outcome {
	return c.move(ctx, "restore", archive, sel, Destination{}, "", nil)
}

// move runs action (replay, edit, delete or restore) on the messages sel
// selects on queue, through dlx.Replay; edit is an edited replay's.
func (c *Console) move(ctx context.Context, action, queue string, sel Selection, dest Destination, who string, edit *editRun) Outcome {
	out := Outcome{Action: action, Queue: queue, Left: -1, Depth: -1, Time: time.Now()}
	out.Requested = sel.Requested()
	switch action {
	case "replay", "edit", "delete":
		out.Destination = dest.String()
	case "restore":
		out.Destination = "the queue each was archived from"
	}
	if out.Requested == 0 {
		out.Err = errors.New("no message selected")
		return out
	}
	opts := []dlx.ReplayOption{dlx.ReplayHeaderPrefix(c.prefix), dlx.ReplayLimit(out.Requested)}
	confirmed, err := c.publisher()
	if err != nil {
		out.Err = err
		return out
	}
	var pub recoverer.Publisher = confirmed
	switch action {
	case "replay", "edit":
		opt, err := dest.option()
		if err != nil {
			out.Err = err
			return out
		}
		if opt != nil {
			opts = append(opts, opt)
		}
		opts = append(opts, dlx.ReplayKeepHistory())
		if edit != nil {
			pub = editingPublisher{Publisher: pub, edit: edit.edit, prefix: c.prefix}
		}
	case "delete":
		open := func() (*amqp.Channel, error) { ch, _, err := c.channel(ctx); return ch, err }
		if err := DeclareArchive(open, queue, c.cfg.ArchiveType); err != nil {
			out.Err = err
			return out
		}
		opts = append(opts, ArchiveOptions(c.prefix, queue, who, time.Now())...)
	case "restore":
		opts = append(opts, RestoreOptions(c.prefix)...)
	}
	// Which messages were matched and done: dlx.Replay calls the match,
	// then publishes and acks (Replayed counts it) or holds the message for
	// want of a destination (Skipped counts it), then reports.
	left := maps.Clone(sel.Keys)
	done := map[string]int{}
	matched, noDest := 0, 0
	var last string
	var prev dlx.ReplayStats
	opts = append(opts,
		dlx.ReplayMatch(func(d *amqp.Delivery) bool {
			k := Key(d)
			if left[k] <= 0 || (sel.Group != nil && !sel.Group.Has(newMessage(*d, 0, c.prefix))) || (edit != nil && contentDigest(d) != edit.digest) {
				last = ""
				return false
			}
			left[k]--
			matched++
			last = k
			return true
		}),
		dlx.ReplayProgress(func(s dlx.ReplayStats) {
			switch {
			case s.Replayed > prev.Replayed && last != "":
				done[last]++
			case s.Skipped > prev.Skipped && last != "":
				noDest++
			}
			last, prev = "", s
		}))
	res, err := c.run(ctx, queue, pub, opts)
	out.Done, out.NoDestination, out.Depth = res.Replayed, noDest, res.Left
	out.Err = err
	if err == nil {
		// The whole queue was looked at, or every message asked for was
		// found: what was not matched is gone.
		out.Missing = out.Requested - matched
		out.Left = matched - out.Done
	} else if matched > 0 || res.Scanned > 0 {
		out.Left = out.Requested - out.Done
	}
	c.forget(queue, done, sel.has)
	return out
}

// Purge deletes every message that is on queue when it begins, through
// dlx.Replay with a discarding publisher, one message at a time.
func (c *Console) Purge(ctx context.Context, queue string) Outcome {
	out := Outcome{Action: "purge", Queue: queue, Left: -1, Depth: -1, Time: time.Now()}
	if depth, err := c.Depth(ctx, queue); err == nil {
		out.Requested = depth
	}
	done := map[string]int{}
	var last string
	var prev dlx.ReplayStats
	opts := []dlx.ReplayOption{dlx.ReplayHeaderPrefix(c.prefix), dlx.ReplayTo(queue),
		dlx.ReplayMatch(func(d *amqp.Delivery) bool { last = Key(d); return true }),
		dlx.ReplayProgress(func(s dlx.ReplayStats) {
			if s.Replayed > prev.Replayed {
				done[last]++
			}
			prev = s
		})}
	res, err := c.run(ctx, queue, discard{}, opts)
	out.Done, out.Depth, out.Err = res.Replayed, res.Left, err
	c.forget(queue, done, nil)
	return out
}

// run runs dlx.Replay on queue in its turn, on a channel of its own.
func (c *Console) run(ctx context.Context, queue string, pub recoverer.Publisher, opts []dlx.ReplayOption) (deadletter.Result, error) {
	res := deadletter.Result{Left: -1}
	unlock, err := c.lock(ctx, queue)
	if err != nil {
		return res, err
	}
	defer unlock()
	ch, _, err := c.channel(ctx)
	if err != nil {
		return res, err
	}
	defer ch.Close()
	return deadletter.Replay(ctx, ch, pub, queue, opts...)
}

// forget removes from queue's snapshot the messages an action took off it:
// for each key in done as many messages of that key as it says, of those in
// reports true of (nil: any).
func (c *Console) forget(queue string, done map[string]int, in func(*Message) bool) {
	if len(done) == 0 {
		return
	}
	st := c.state(queue)
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.snap != nil {
		st.snap = st.snap.without(done, in)
	}
}

// sortedKeys is keys' keys in order, for the audit log.
func sortedKeys(keys map[string]int) []string { return slices.Sorted(maps.Keys(keys)) }
