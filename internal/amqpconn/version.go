package amqpconn

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ServerVersion is a broker's version as its connection reports it (the
// "version" server property). The zero value is an unknown version.
type ServerVersion struct {
	Major, Minor, Patch int
	Product             string // "RabbitMQ"
	Known               bool
}

// VersionOf reads the version from a connection's server properties.
func VersionOf(props amqp.Table) ServerVersion {
	v, _ := props["version"].(string)
	product, _ := props["product"].(string)
	ver, ok := ParseVersion(v)
	ver.Product, ver.Known = product, ok
	return ver
}

// ParseVersion reads "4.3.6" (or "4.3.0-rc.1", "3.10") as 4, 3, 6.
func ParseVersion(s string) (ServerVersion, bool) {
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return ServerVersion{}, false
	}
	var nums [3]int
	for i, p := range parts {
		p, _, _ = strings.Cut(p, "-")
		p, _, _ = strings.Cut(p, "+")
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			if i == 2 { // an odd patch level does not hide major.minor
				break
			}
			return ServerVersion{}, false
		}
		nums[i] = n
	}
	return ServerVersion{Major: nums[0], Minor: nums[1], Patch: nums[2], Known: true}, true
}

// AtLeast reports whether v is known and at least major.minor.
func (v ServerVersion) AtLeast(major, minor int) bool {
	return v.Known && (v.Major > major || (v.Major == major && v.Minor >= minor))
}

func (v ServerVersion) String() string {
	if !v.Known {
		return "an unknown version"
	}
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
}

// Channels opened by this module remember the version of the broker they
// talk to, so that code handed only a channel (a Topology's Declare, a
// recoverer handed a delivery, whose Acknowledger is its channel) can adapt
// to the broker. amqp091's Channel does not expose its connection. They
// also collect what a declaration on them notes for the listener that
// opened them (NoteSingleActive).
var channelInfos sync.Map // *amqp.Channel → *channelInfo

type channelInfo struct {
	version ServerVersion

	mu           sync.Mutex
	singleActive map[string]bool // queues declared with single active consumer
}

// Remember records the version of the broker ch talks to, until forget is
// called (when the channel is done with).
func Remember(ch *amqp.Channel, v ServerVersion) (forget func()) {
	channelInfos.Store(ch, &channelInfo{version: v})
	return func() { channelInfos.Delete(ch) }
}

// ChannelVersion is the version remembered for ch (an *amqp.Channel, or a
// delivery's Acknowledger, which is its channel); unknown for a channel this
// module did not open.
func ChannelVersion(ch any) ServerVersion {
	if info := infoOf(ch); info != nil {
		return info.version
	}
	return ServerVersion{}
}

func infoOf(ch any) *channelInfo {
	c, ok := ch.(*amqp.Channel)
	if !ok || c == nil {
		return nil
	}
	v, _ := channelInfos.Load(c)
	info, _ := v.(*channelInfo)
	return info
}

// NoteSingleActive records that queue was declared on ch with single active
// consumer (x-single-active-consumer), for the listener whose declarations
// ran there: no AMQP method reads a queue's arguments back. A no-op on a
// channel this module did not open.
func NoteSingleActive(ch *amqp.Channel, queue string) {
	info := infoOf(ch)
	if info == nil {
		return
	}
	info.mu.Lock()
	defer info.mu.Unlock()
	if info.singleActive == nil {
		info.singleActive = map[string]bool{}
	}
	info.singleActive[queue] = true
}

// DeclaredSingleActive reports whether a declaration on ch noted queue as
// single active consumer (NoteSingleActive).
func DeclaredSingleActive(ch *amqp.Channel, queue string) bool {
	info := infoOf(ch)
	if info == nil {
		return false
	}
	info.mu.Lock()
	defer info.mu.Unlock()
	return info.singleActive[queue]
}
