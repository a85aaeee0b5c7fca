package publisher

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/errtree"
)

// When the broker closes a shared channel with an exception whose text names
// none of the messages awaiting their confirm on it (a 403 for a publish to
// an internal exchange, say), any of them may be the cause. Sending each
// again alone, one after another, costs one confirm round trip per message:
// 500 in flight, 500 round trips one after another before the last innocent
// is confirmed. The isolator searches instead: it splits the suspects into
// at most maxIsolationParts groups and sends every group at once, each
// pipelined on a fresh confirm channel of its own. A group whose channel
// stays open is innocent and confirmed. A group whose channel the broker
// closes holds the cause among the messages it did not confirm: if that is
// one message, it is the cause and fails with a *ChannelError; otherwise
// those are split and searched again, in parallel, the same way. With one
// cause among n suspects that takes ceil(log8 n) rounds (3 for 500; a single
// round, every message alone at once, for up to 8) and at most 8 channels a
// round; several causes search their groups side by side, with at most
// maxIsolationChannels channels open at once on the connection.
//
// The work is bounded: every round shrinks a group eightfold, so a search
// has at most ceil(log8 n) rounds; each round waits at most the confirm
// timeout; a message whose caller stopped waiting (its context, or its own
// confirm timeout, counted from its first send) is not sent again; and the
// search ends with the connection, a message then lost being published
// again by its caller. Each message gets exactly one outcome: the isolator
// gives it in place of the dead channel.
//
// Why groups of 8 and not halves: a message sent again in a group that the
// broker closes may have been stored before the close, unconfirmed, like
// any message lost with its channel, and it is sent again in the next round.
// Each round it is lost in can leave a copy, so fewer, wider rounds mean
// fewer duplicates (at most 1 + the rounds it was lost in) as well as fewer
// round trips, for a few more channels than halving would open.
const (
	maxIsolationParts    = 8  // groups a set of suspects is split into each round
	maxIsolationChannels = 16 // isolation channels open at once on a connection
)

// An isolator runs the searches on one connection; serve stops it, and it
// waits for them, when the connection goes.
type isolator struct {
	p      *Publisher
	conn   *amqp.Connection
	ctx    context.Context // done when the connection goes
	cancel context.CancelFunc
	slots  chan struct{} // a slot per isolation channel open

	mu      sync.Mutex
	stopped bool
	wg      sync.WaitGroup // the searches
}

func (p *Publisher) newIsolator(conn *amqp.Connection) *isolator {
	ctx, cancel := context.WithCancel(p.closing)
	return &isolator{p: p, conn: conn, ctx: ctx, cancel: cancel, slots: make(chan struct{}, maxIsolationChannels)}
}

// start searches suspects for the cause of their channel's exception and
// gives each of them its outcome. False if the connection is going: the
// caller fails them as lost.
func (iso *isolator) start(suspects []*inflight) bool {
	iso.mu.Lock()
	defer iso.mu.Unlock()
	if iso.stopped {
		return false
	}
	iso.wg.Add(1)
	iso.p.searching.Add(1)
	go func() {
		defer iso.wg.Done()
		defer iso.p.searching.Add(-1)
		iso.search(&searchRounds{p: iso.p}, 1, suspects)
	}()
	return true
}

// stop ends the searches, whose messages are then failed as lost, and waits
// for them.
func (iso *isolator) stop() {
	iso.mu.Lock()
	iso.stopped = true
	iso.mu.Unlock()
	iso.cancel()
	iso.wg.Wait()
}

// searchRounds counts the rounds of one search, one after another, into the
// Publisher's suspectRounds.
type searchRounds struct {
	p     *Publisher
	mu    sync.Mutex
	depth int
}

func (r *searchRounds) reached(depth int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if depth > r.depth {
		r.depth = depth
		r.p.suspectRounds.Add(1)
	}
}

// search splits suspects into groups, tries every group at once, and waits
// for them all; a group that holds a cause searches its own suspects further.
func (iso *isolator) search(rounds *searchRounds, depth int, suspects []*inflight) {
	var wg sync.WaitGroup
	size := (len(suspects) + maxIsolationParts - 1) / maxIsolationParts
	for start := 0; start < len(suspects); start += size {
		group := suspects[start:min(start+size, len(suspects))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			iso.try(rounds, depth, group)
		}()
	}
	wg.Wait()
}

// try sends group again on a channel of its own and gives each message its
// outcome, or searches further among those the broker's exception leaves in
// doubt.
func (iso *isolator) try(rounds *searchRounds, depth int, group []*inflight) {
	live := make([]*inflight, 0, len(group))
	for _, f := range group {
		if !f.abandoned.Load() {
			live = append(live, f)
		}
	}
	if len(live) == 0 {
		return
	}
	rounds.reached(depth)
	suspects, unsent, cause := iso.round(live)
	if len(suspects) == 1 {
		// Alone in doubt on a channel that only this group used: every
		// other message sent on it was confirmed or failed for a reason
		// of its own, so the exception is this one's.
		f := suspects[0]
		f.finish(&ChannelError{Exchange: f.exchange, Code: cause.Code, Reason: cause.Reason})
		suspects = nil
	}
	// Messages the closing channel kept from being sent were not tested:
	// they are searched with the suspects, in the same next round, unless
	// none of the group went out (then the connection is failing).
	if len(unsent) == len(live) {
		for _, f := range unsent {
			f.finish(&channelLostError{})
		}
		unsent = nil
	}
	if rest := append(suspects, unsent...); len(rest) > 0 {
		iso.search(rounds, depth+1, rest)
	}
}

// round sends group pipelined on a fresh channel and waits for each outcome,
// which it gives to the message, unless the broker closed the channel with
// an exception its text pins on none of them: those in doubt are returned
// as suspects, with cause, and those that the closed channel kept from
// being sent as unsent.
func (iso *isolator) round(group []*inflight) (suspects, unsent []*inflight, cause *amqp.Error) {
	lost := func(fs []*inflight) {
		for _, f := range fs {
			f.finish(&channelLostError{})
		}
	}
	select {
	case iso.slots <- struct{}{}:
	case <-iso.ctx.Done():
		lost(group) // the connection is going: published again after the redial
		return nil, nil, nil
	}
	defer func() { <-iso.slots }()
	cc, err := openConfirmChannel(iso.conn, nil, nil)
	if err != nil {
		lost(group)
		return nil, nil, nil
	}
	defer cc.close()

	if !iso.waitUnblocked() {
		lost(group)
		return nil, nil, nil
	}
	sent := make([]*inflight, len(group)) // the copy sent on cc
	for i, f := range group {
		if f.abandoned.Load() {
			// Its caller stopped waiting while this round waited for its
			// slot, its channel or the broker: told it was not confirmed,
			// it is not sent again.
			continue
		}
		g, err := cc.send(iso.ctx, f.exchange, f.key, f.msg, f.mandatory, nil, nil)
		if err == nil {
			sent[i] = g
			continue
		}
		if le, ok := errtree.As[*channelLostError](err); ok && le.sendErr == nil && !cc.alive() {
			unsent = append(unsent, f) // cc closed under the group
			continue
		}
		if le, ok := errtree.As[*channelLostError](err); ok {
			f.finish(le)
		} else {
			f.finish(&channelLostError{}) // iso.ctx ended: nothing went out
		}
	}

	timer := time.NewTimer(iso.p.cfg.confirmTimeout)
	defer timer.Stop()
	expired := false
	for i, g := range sent {
		if g == nil {
			continue
		}
		f := group[i]
		var err error
		if !expired {
			select {
			case err = <-g.result:
			case <-timer.C:
				expired = true
			case <-iso.ctx.Done():
				err = &channelLostError{}
			}
		}
		if expired {
			select {
			case err = <-g.result:
			default:
				err = &notConfirmedError{exchange: f.exchange, key: f.key, cause: fmt.Errorf("no confirm within %v (WithConfirmTimeout)", iso.p.cfg.confirmTimeout)}
			}
		}
		if le, ok := errtree.As[*channelLostError](err); ok && !le.attributed && isChannelException(le.cause) {
			suspects, cause = append(suspects, f), le.cause
			continue
		}
		f.finish(err) // confirmed, returned, nacked, failed by name, or lost
	}
	return suspects, unsent, cause
}

// waitUnblocked waits while the broker blocks publishing (a memory or disk
// alarm), as pickChannel does: a send then hangs in the socket, out of reach
// of any context. False if the connection goes meanwhile.
func (iso *isolator) waitUnblocked() bool {
	for {
		set := iso.p.channels.Load()
		if !set.blocked {
			return true
		}
		select {
		case <-set.changed:
		case <-iso.ctx.Done():
			return false
		}
	}
}
