package faultproxy

import "encoding/binary"

// RecordMethods makes the proxy count the AMQP methods that clients send on
// the connections it accepts from now on, so that a test can assert which
// frame a code path sent: basic.nack rather than basic.reject, say.
func (p *Proxy) RecordMethods() { p.record.Store(true) }

// Sent returns how many times clients sent the method, named as in the AMQP
// 0-9-1 specification ("basic.reject", "basic.nack", "basic.ack"). An ack
// with its multiple flag set counts as "basic.ack" and as "basic.ack
// multiple".
func (p *Proxy) Sent(method string) int {
	p.methodsMu.Lock()
	defer p.methodsMu.Unlock()
	return p.methods[method]
}

func (p *Proxy) countMethod(name string) {
	p.methodsMu.Lock()
	defer p.methodsMu.Unlock()
	if p.methods == nil {
		p.methods = map[string]int{}
	}
	p.methods[name]++
}

const basicAck = 60<<16 | 80

// methodNames are the methods a test may ask about, by class and method id.
var methodNames = map[uint32]string{
	10<<16 | 50:  "connection.close",
	20<<16 | 10:  "channel.open",
	20<<16 | 40:  "channel.close",
	60<<16 | 20:  "basic.consume",
	60<<16 | 30:  "basic.cancel",
	60<<16 | 40:  "basic.publish",
	60<<16 | 70:  "basic.get",
	60<<16 | 80:  "basic.ack",
	60<<16 | 90:  "basic.reject",
	60<<16 | 110: "basic.recover",
	60<<16 | 120: "basic.nack",
}

// methodReader splits one client's byte stream into AMQP frames: the 8-byte
// protocol header, then frames of type (1), channel (2), size (4), payload,
// end marker. A method frame's payload starts with its class and method ids.
type methodReader struct {
	count     func(string)
	buf       []byte
	skipped   bool // the protocol header
	corrupted bool
}

func (m *methodReader) feed(chunk []byte) {
	if m.corrupted {
		return
	}
	m.buf = append(m.buf, chunk...)
	if !m.skipped {
		if len(m.buf) < 8 {
			return
		}
		m.buf, m.skipped = m.buf[8:], true
	}
	for len(m.buf) >= 7 {
		size := int(binary.BigEndian.Uint32(m.buf[3:7]))
		if len(m.buf) < 7+size+1 {
			return
		}
		if m.buf[7+size] != 0xCE {
			m.corrupted = true // not AMQP: stop rather than count garbage
			return
		}
		if m.buf[0] == 1 && size >= 4 {
			id := uint32(binary.BigEndian.Uint16(m.buf[7:9]))<<16 | uint32(binary.BigEndian.Uint16(m.buf[9:11]))
			name, ok := methodNames[id]
			if !ok {
				name = "unknown"
			}
			m.count(name)
			// basic.ack's arguments: delivery-tag (8 octets), then the
			// multiple bit.
			if id == basicAck && size >= 4+8+1 && m.buf[7+4+8]&1 != 0 {
				m.count("basic.ack multiple")
			}
		}
		m.buf = m.buf[7+size+1:]
	}
	// What remains is the start of the next frame: keep it in a fresh slice
	// so a long stream does not pin every chunk before it.
	m.buf = append([]byte(nil), m.buf...)
}
