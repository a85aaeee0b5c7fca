package framecheck

import (
	"encoding/binary"
	"fmt"
	"math"
	"net"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
)

// What amqp091-go v1.16.0's reader takes (read.go: maxFieldDepth,
// maxContainerElements): the header table is level 0.
const (
	maxDepth    = 32
	maxElements = 8192
)

const (
	frameHeader = 2
	frameEnd    = 0xCE
	// frameLimit is the largest frame Guard buffers; past it (a corrupt
	// size) it stops looking and passes the bytes through for amqp091-go
	// to refuse.
	frameLimit = 64 << 20
	// property flags of a content header (AMQP 0-9-1, basic class)
	flagContentType     = 0x8000
	flagContentEncoding = 0x4000
	flagHeaders         = 0x2000
)

// Guard wraps c so that every content header frame it reads carries a
// header table amqp091-go can parse (see the package documentation). Writes,
// deadlines and Close go to c unchanged.
func Guard(c net.Conn) net.Conn { return &guarded{Conn: c} }

type guarded struct {
	net.Conn
	in, out []byte // read from c, not yet a whole frame; ready for the caller
	buf     []byte // for reads from c
	started bool
	through bool // not AMQP frames (a protocol header refusal): pass as is
}

func (g *guarded) Read(p []byte) (int, error) {
	for len(g.out) == 0 {
		if g.through && len(g.in) > 0 {
			g.out, g.in = g.in, nil
			break
		}
		if !g.through && g.frame() {
			continue
		}
		if g.buf == nil {
			g.buf = make([]byte, 32*1024)
		}
		n, err := g.Conn.Read(g.buf)
		g.in = append(g.in, g.buf[:n]...)
		if !g.started && len(g.in) > 0 {
			g.started = true
			g.through = g.in[0] == 'A' // "AMQP" and a version: the broker refuses ours
		}
		if err != nil && n == 0 {
			if len(g.in) > 0 { // what there is, for amqp091-go to judge
				g.out, g.in = g.in, nil
				break
			}
			return 0, err
		}
	}
	n := copy(p, g.out)
	g.out = g.out[n:]
	return n, nil
}

// frame moves one whole frame from in to out, rewritten if need be, and
// reports whether there was one.
func (g *guarded) frame() bool {
	if len(g.in) < 7 {
		return false
	}
	size := binary.BigEndian.Uint32(g.in[3:7])
	if size > frameLimit {
		g.through = true
		return false
	}
	end := 7 + int(size) + 1
	if len(g.in) < end {
		return false
	}
	f := g.in[:end]
	if f[0] == frameHeader {
		if rewritten, ok := Rewrite(f); ok {
			f = rewritten
		}
	}
	g.out = append(g.out, f...)
	g.in = g.in[end:]
	if len(g.in) == 0 {
		g.in = nil // let a large frame's buffer go
	}
	return true
}

// Rewrite returns the content header frame f (type, channel, size, payload,
// frame end) with its header table replaced by one holding
// amqphdr.UnreadableHeaders and the reason, and true, when amqp091-go could
// not parse the table; otherwise f and false.
func Rewrite(f []byte) ([]byte, bool) {
	payload := f[7 : len(f)-1]
	if len(payload) < 14 {
		return f, false
	}
	flags := binary.BigEndian.Uint16(payload[12:14])
	if flags&flagHeaders == 0 {
		return f, false
	}
	at := 14
	for _, flag := range []uint16{flagContentType, flagContentEncoding} {
		if flags&flag != 0 {
			if at >= len(payload) {
				return f, false
			}
			at += 1 + int(payload[at])
		}
	}
	if at+4 > len(payload) {
		return f, false
	}
	length := binary.BigEndian.Uint32(payload[at : at+4])
	if length > math.MaxInt32 || at+4+int(length) > len(payload) {
		return f, false // amqp091-go refuses the frame as a whole: nothing to replace
	}
	table := payload[at+4 : at+4+int(length)]
	problem := TableProblem(table)
	if problem == "" {
		return f, false
	}
	replacement := tableOf(amqphdr.UnreadableHeaders,
		fmt.Sprintf("amqp091-go cannot read this message's headers (%d bytes): %s; the broker still holds them", len(table), problem))
	out := make([]byte, 0, len(f)-len(table)+len(replacement))
	out = append(out, f[:7]...)
	out = append(out, payload[:at]...)
	out = append(out, replacement...)
	out = append(out, payload[at+4+int(length):]...)
	out = append(out, frameEnd)
	binary.BigEndian.PutUint32(out[3:7], uint32(len(out)-8))
	return out, true
}

// tableOf is a field table, length included, of one string field.
func tableOf(key, value string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(1+len(key)+1+4+len(value)))
	b = append(b, byte(len(key)))
	b = append(b, key...)
	b = append(b, 'S')
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

// TableProblem says why amqp091-go v1.16.0 would refuse the header table
// whose content (after its length) is b, or "" when it reads it.
func TableProblem(b []byte) string {
	_, problem := table(b, 0)
	return problem
}

// table checks the content of a table at depth; it returns how many entries
// it has.
func table(b []byte, depth int) (int, string) {
	if depth > maxDepth {
		return 0, fmt.Sprintf("tables or arrays nest deeper than %d levels", maxDepth)
	}
	start, n := b, 0
	for len(b) > 0 {
		klen := int(b[0])
		if 1+klen > len(b) {
			return n, "a field name runs past its table"
		}
		b = b[1+klen:]
		var problem string
		if b, problem = field(b, depth); problem != "" {
			return n, problem
		}
		n++
	}
	if n > maxElements && distinctBeforeLast(start) >= maxElements {
		return n, fmt.Sprintf("a table holds more than %d entries", maxElements)
	}
	return n, ""
}

// distinctBeforeLast counts the distinct names of a table's entries but the
// last: amqp091-go refuses an entry read when its map already holds
// maxElements names.
func distinctBeforeLast(b []byte) int {
	var keys []string
	for len(b) > 0 {
		klen := int(b[0])
		keys = append(keys, string(b[1:1+klen]))
		b, _ = field(b[1+klen:], 0) // checked already: nothing runs past
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys[:len(keys)-1] {
		seen[k] = true
	}
	return len(seen)
}

// field checks one field value (its type tag first) and returns what
// follows it.
func field(b []byte, depth int) ([]byte, string) {
	if len(b) == 0 {
		return nil, "a field has no value"
	}
	tag, b := b[0], b[1:]
	if n, ok := fixedSize(tag); ok {
		if n > len(b) {
			return nil, "a field runs past its table"
		}
		return b[n:], ""
	}
	switch tag {
	case 'S', 'x', 'A', 'F':
		if len(b) < 4 {
			return nil, "a field runs past its table"
		}
		n := binary.BigEndian.Uint32(b)
		if n > math.MaxInt32 {
			return nil, "a field's length is over 2 GiB"
		}
		b = b[4:]
		if int(n) > len(b) {
			return nil, "a field runs past its table"
		}
		content, rest := b[:n], b[n:]
		switch tag {
		case 'A':
			if problem := array(content, depth+1); problem != "" {
				return nil, problem
			}
		case 'F':
			if _, problem := table(content, depth+1); problem != "" {
				return nil, problem
			}
		}
		return rest, ""
	}
	return nil, fmt.Sprintf("a field has the type %q, which amqp091-go does not know", tag)
}

func array(b []byte, depth int) string {
	if depth > maxDepth {
		return fmt.Sprintf("tables or arrays nest deeper than %d levels", maxDepth)
	}
	for n := 0; len(b) > 0; n++ {
		if n >= maxElements {
			return fmt.Sprintf("an array holds more than %d elements", maxElements)
		}
		var problem string
		if b, problem = field(b, depth); problem != "" {
			return problem
		}
	}
	return ""
}

// fixedSize is the size of a field of a fixed-size type.
func fixedSize(tag byte) (int, bool) {
	switch tag {
	case 'V':
		return 0, true
	case 't', 'B', 'b':
		return 1, true
	case 's', 'u':
		return 2, true
	case 'I', 'i', 'f':
		return 4, true
	case 'D':
		return 5, true
	case 'l', 'd', 'T':
		return 8, true
	}
	return 0, false
}
