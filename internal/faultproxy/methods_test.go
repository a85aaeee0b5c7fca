package faultproxy

import (
	"encoding/binary"
	"testing"
)

func frame(typ byte, payload []byte) []byte {
	f := []byte{typ, 0, 1, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(f[3:7], uint32(len(payload)))
	return append(append(f, payload...), 0xCE)
}

func method(class, id uint16, args ...byte) []byte {
	p := binary.BigEndian.AppendUint16(nil, class)
	return frame(1, append(binary.BigEndian.AppendUint16(p, id), args...))
}

// The reader finds method frames however the stream is cut into chunks, and
// passes over content frames whose bodies look like frames.
func TestMethodReaderSplitsFrames(t *testing.T) {
	stream := []byte("AMQP\x00\x00\x09\x01")
	stream = append(stream, method(60, 40, 0, 0)...)                      // basic.publish
	stream = append(stream, frame(2, make([]byte, 14))...)                // content header
	stream = append(stream, frame(3, method(60, 90, 1, 2))...)            // a body holding a reject frame
	stream = append(stream, method(60, 120, 0, 0, 0, 0)...)               // basic.nack
	stream = append(stream, method(60, 90, 0, 0)...)                      // basic.reject
	stream = append(stream, method(99, 1)...)                             // unknown
	stream = append(stream, method(60, 80, 0, 0, 0, 0, 0, 0, 0, 7, 0)...) // basic.ack 7
	stream = append(stream, method(60, 80, 0, 0, 0, 0, 0, 0, 0, 9, 1)...) // basic.ack 9, multiple
	for _, chunk := range []int{1, 2, 3, 7, 8, 13, len(stream)} {
		got := map[string]int{}
		r := &methodReader{count: func(name string) { got[name]++ }}
		for i := 0; i < len(stream); i += chunk {
			r.feed(stream[i:min(i+chunk, len(stream))])
		}
		want := map[string]int{"basic.publish": 1, "basic.nack": 1, "basic.reject": 1, "unknown": 1, "basic.ack": 2, "basic.ack multiple": 1}
		if len(got) != len(want) {
			t.Fatalf("chunks of %d: counted %v, want %v", chunk, got, want)
		}
		for k, n := range want {
			if got[k] != n {
				t.Errorf("chunks of %d: %s counted %d times, want %d", chunk, k, got[k], n)
			}
		}
	}
}

func TestMethodReaderStopsOnGarbage(t *testing.T) {
	got := 0
	r := &methodReader{count: func(string) { got++ }}
	r.feed([]byte("AMQP\x00\x00\x09\x01"))
	bad := method(60, 90)
	bad[len(bad)-1] = 0x00 // no frame end
	r.feed(append(bad, method(60, 90)...))
	if got != 0 || !r.corrupted {
		t.Fatalf("counted %d methods in a stream without frame ends", got)
	}
}
