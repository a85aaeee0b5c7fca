package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The properties column holds every property of an amqp.Publishing except
// the body and the message id (columns of their own), headers included, in
// an encoding this package owns: a version byte, then each property in a
// fixed order, then the header table. Header values keep their Go type
// (int16 stays int16, a float64 NaN keeps its bits), so a message the relay
// publishes has exactly the fields the caller enqueued. Times keep their
// instant to the nanosecond and come back in UTC: AMQP carries no zone.
const propertiesVersion = 1

// Value tags. Never renumber: rows written by an older version must decode.
const (
	tagNil byte = iota + 1
	tagBool
	tagInt8
	tagUint8
	tagInt16
	tagUint16
	tagInt32
	tagUint32
	tagInt64
	tagInt
	tagFloat32
	tagFloat64
	tagDecimal
	tagString
	tagBytes
	tagTime
	tagArray
	tagTable
)

// maxDepth bounds nesting on both sides, so a corrupt row cannot exhaust
// the stack. amqp091 itself has no limit; no real header nests this deep.
const maxDepth = 64

var errCorrupt = errors.New("outbox: the properties column cannot be decoded")

func encodeProperties(msg amqp.Publishing) ([]byte, error) {
	b := []byte{propertiesVersion}
	for _, s := range []string{msg.ContentType, msg.ContentEncoding, msg.CorrelationId, msg.ReplyTo,
		msg.Expiration, msg.Type, msg.UserId, msg.AppId} {
		b = appendString(b, s)
	}
	b = append(b, msg.DeliveryMode, msg.Priority)
	b = appendTime(b, msg.Timestamp)
	if msg.Headers == nil {
		return append(b, tagNil), nil
	}
	return appendValue(b, msg.Headers, 0)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

func appendValue(b []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("headers nest deeper than %d levels", maxDepth)
	}
	switch x := v.(type) {
	case nil:
		return append(b, tagNil), nil
	case bool:
		if x {
			return append(b, tagBool, 1), nil
		}
		return append(b, tagBool, 0), nil
	case int8:
		return append(b, tagInt8, byte(x)), nil
	case uint8:
		return append(b, tagUint8, x), nil
	case int16:
		return binary.BigEndian.AppendUint16(append(b, tagInt16), uint16(x)), nil
	case uint16:
		return binary.BigEndian.AppendUint16(append(b, tagUint16), x), nil
	case int32:
		return binary.BigEndian.AppendUint32(append(b, tagInt32), uint32(x)), nil
	case uint32:
		return binary.BigEndian.AppendUint32(append(b, tagUint32), x), nil
	case int64:
		return binary.BigEndian.AppendUint64(append(b, tagInt64), uint64(x)), nil
	case int:
		return binary.BigEndian.AppendUint64(append(b, tagInt), uint64(x)), nil
	case float32:
		return binary.BigEndian.AppendUint32(append(b, tagFloat32), math.Float32bits(x)), nil
	case float64:
		return binary.BigEndian.AppendUint64(append(b, tagFloat64), math.Float64bits(x)), nil
	case amqp.Decimal:
		b = append(b, tagDecimal, x.Scale)
		return binary.BigEndian.AppendUint32(b, uint32(x.Value)), nil
	case string:
		return appendString(append(b, tagString), x), nil
	case []byte:
		b = binary.AppendUvarint(append(b, tagBytes), uint64(len(x)))
		return append(b, x...), nil
	case time.Time:
		return appendTime(append(b, tagTime), x), nil
	case []any:
		b = binary.AppendUvarint(append(b, tagArray), uint64(len(x)))
		for i, e := range x {
			var err error
			if b, err = appendValue(b, e, depth+1); err != nil {
				return nil, fmt.Errorf("array element %d: %w", i, err)
			}
		}
		return b, nil
	case amqp.Table:
		b = binary.AppendUvarint(append(b, tagTable), uint64(len(x)))
		// Sorted keys: the same message always encodes to the same bytes.
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b = appendString(b, k)
			var err error
			if b, err = appendValue(b, x[k], depth+1); err != nil {
				return nil, fmt.Errorf("header %q: %w", k, err)
			}
		}
		return b, nil
	}
	return nil, fmt.Errorf("a header value of type %T cannot be sent over AMQP", v)
}

// decodeProperties fills every property of msg but Body and MessageId. It
// never panics, whatever the bytes.
func decodeProperties(data []byte) (amqp.Publishing, error) {
	d := decoder{b: data}
	var msg amqp.Publishing
	if v := d.byte(); v != propertiesVersion {
		return msg, fmt.Errorf("%w: version %d, want %d (was the row written by a newer amqpretry?)", errCorrupt, v, propertiesVersion)
	}
	for _, s := range []*string{&msg.ContentType, &msg.ContentEncoding, &msg.CorrelationId, &msg.ReplyTo,
		&msg.Expiration, &msg.Type, &msg.UserId, &msg.AppId} {
		*s = d.string()
	}
	msg.DeliveryMode, msg.Priority = d.byte(), d.byte()
	msg.Timestamp = d.time()
	h := d.value(0)
	if t, ok := h.(amqp.Table); ok {
		msg.Headers = t
	} else if h != nil {
		d.fail("the headers are a %T, not a table", h)
	}
	if d.err == nil && d.off != len(d.b) {
		d.fail("%d bytes left over", len(d.b)-d.off)
	}
	if d.err != nil {
		return amqp.Publishing{}, d.err
	}
	return msg, nil
}

type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w at byte %d: %s", errCorrupt, d.off, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) take(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail("%d bytes wanted, %d left", n, len(d.b)-d.off)
		return nil
	}
	p := d.b[d.off : d.off+int(n)]
	d.off += int(n)
	return p
}

func (d *decoder) byte() byte {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad length")
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad number")
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) string() string { return string(d.take(d.uvarint())) }

func (d *decoder) time() time.Time {
	switch d.byte() {
	case 0:
		return time.Time{}
	case 1:
		sec, nsec := d.varint(), d.uvarint()
		if nsec >= 1e9 {
			d.fail("nanoseconds %d out of range", nsec)
			return time.Time{}
		}
		return time.Unix(sec, int64(nsec)).UTC()
	}
	d.fail("bad time marker")
	return time.Time{}
}

// count reads an element count that the remaining bytes could hold (each
// element takes at least one byte), so a corrupt count cannot make a huge
// allocation.
func (d *decoder) count() int {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)-d.off) {
		d.fail("count %d exceeds the %d bytes left", n, len(d.b)-d.off)
		return 0
	}
	return int(n)
}

func (d *decoder) value(depth int) any {
	if depth > maxDepth {
		d.fail("nested deeper than %d", maxDepth)
		return nil
	}
	tag := d.byte()
	if d.err != nil {
		return nil
	}
	switch tag {
	case tagNil:
		return nil
	case tagBool:
		switch d.byte() {
		case 0:
			return false
		case 1:
			return true
		}
		d.fail("bad bool")
	case tagInt8:
		return int8(d.byte())
	case tagUint8:
		return d.byte()
	case tagInt16:
		if p := d.take(2); p != nil {
			return int16(binary.BigEndian.Uint16(p))
		}
	case tagUint16:
		if p := d.take(2); p != nil {
			return binary.BigEndian.Uint16(p)
		}
	case tagInt32:
		if p := d.take(4); p != nil {
			return int32(binary.BigEndian.Uint32(p))
		}
	case tagUint32:
		if p := d.take(4); p != nil {
			return binary.BigEndian.Uint32(p)
		}
	case tagInt64:
		if p := d.take(8); p != nil {
			return int64(binary.BigEndian.Uint64(p))
		}
	case tagInt:
		if p := d.take(8); p != nil {
			return int(int64(binary.BigEndian.Uint64(p)))
		}
	case tagFloat32:
		if p := d.take(4); p != nil {
			return math.Float32frombits(binary.BigEndian.Uint32(p))
		}
	case tagFloat64:
		if p := d.take(8); p != nil {
			return math.Float64frombits(binary.BigEndian.Uint64(p))
		}
	case tagDecimal:
		scale := d.byte()
		if p := d.take(4); p != nil {
			return amqp.Decimal{Scale: scale, Value: int32(binary.BigEndian.Uint32(p))}
		}
	case tagString:
		return d.string()
	case tagBytes:
		if p := d.take(d.uvarint()); p != nil {
			return slices.Clone(p)
		}
		if d.err == nil {
			return []byte{}
		}
	case tagTime:
		return d.time()
	case tagArray:
		n := d.count()
		arr := make([]any, 0, n)
		for range n {
			arr = append(arr, d.value(depth+1))
		}
		if d.err == nil {
			return arr
		}
	case tagTable:
		n := d.count()
		t := make(amqp.Table, n)
		for range n {
			k := d.string()
			if _, dup := t[k]; dup && d.err == nil {
				d.fail("key %q twice", k)
			}
			t[k] = d.value(depth + 1)
		}
		if d.err == nil {
			return t
		}
	default:
		d.fail("unknown value tag %d", tag)
	}
	return nil
}
