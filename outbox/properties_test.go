package outbox

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// every is a message with every property set and a header of every type
// amqp091 can send, at the edges of their ranges.
func every() amqp.Publishing {
	return amqp.Publishing{
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 9,
		CorrelationId: "c", ReplyTo: "r", Expiration: "1000", Timestamp: time.Unix(1700000000, 123).UTC(),
		Type: "t", UserId: "guest", AppId: "app",
		Headers: amqp.Table{
			"nil": nil, "true": true, "false": false,
			"i8": int8(math.MinInt8), "u8": uint8(math.MaxUint8),
			"i16": int16(math.MinInt16), "u16": uint16(math.MaxUint16),
			"i32": int32(math.MinInt32), "u32": uint32(math.MaxUint32),
			"i64": int64(math.MinInt64), "int": math.MaxInt,
			"f32": float32(-0.5), "f64": math.Inf(-1), "nan": math.NaN(),
			"dec": amqp.Decimal{Scale: 255, Value: math.MinInt32},
			"str": "ünïcödé\x00", "": "empty key", "bytes": []byte{0, 255}, "nobytes": []byte{},
			"time": time.Unix(-1, 999999999).UTC(),
			"arr":  []any{nil, "a", []any{int16(1), amqp.Table{}}, []any{}},
			"tbl":  amqp.Table{"a": amqp.Table{"b": []any{amqp.Decimal{}}}},
		},
	}
}

func TestPropertiesRoundTrip(t *testing.T) {
	deep := amqp.Table{}
	for range maxDepth - 1 {
		deep = amqp.Table{"d": deep}
	}
	for name, msg := range map[string]amqp.Publishing{
		"empty":           {},
		"every field":     every(),
		"empty headers":   {Headers: amqp.Table{}},
		"deepest allowed": {Headers: deep},
		"long string":     {Headers: amqp.Table{"s": strings.Repeat("x", 1<<20)}},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := encodeProperties(msg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeProperties(b)
			if err != nil {
				t.Fatal(err)
			}
			if diff := comparePublishing(msg, got); diff != "" {
				t.Fatal(diff)
			}
		})
	}
}

func TestPropertiesRefused(t *testing.T) {
	deep := amqp.Table{}
	for range maxDepth + 1 {
		deep = amqp.Table{"d": deep}
	}
	for name, h := range map[string]amqp.Table{
		"channel":   {"c": make(chan int)},
		"too deep":  deep,
		"in array":  {"a": []any{struct{}{}}},
		"map value": {"m": map[int]int{}},
	} {
		if _, err := encodeProperties(amqp.Publishing{Headers: h}); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

func TestCorruptPropertiesAreErrors(t *testing.T) {
	good, err := encodeProperties(every())
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(good) {
		if _, err := decodeProperties(good[:i]); err == nil {
			t.Fatalf("a cut at byte %d of %d decoded", i, len(good))
		}
	}
	for name, b := range map[string][]byte{
		"no bytes":        nil,
		"other version":   {2},
		"trailing":        append(append([]byte{}, good...), 0),
		"huge count":      binary.AppendUvarint(append(encodeMinimal(), tagTable), 1<<40),
		"headers not map": append(encodeMinimal(), tagString, 0),
	} {
		if _, err := decodeProperties(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// encodeMinimal is an empty message's bytes without the headers' tag.
func encodeMinimal() []byte {
	b, _ := encodeProperties(amqp.Publishing{})
	return b[:len(b)-1]
}

// FuzzProperties: decoding never panics, and whatever decodes encodes and
// decodes again to the same message.
func FuzzProperties(f *testing.F) {
	for _, m := range []amqp.Publishing{{}, every(), {Headers: amqp.Table{"a": []any{int8(1)}}}} {
		b, _ := encodeProperties(m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := decodeProperties(data)
		if err != nil {
			return
		}
		again, err := encodeProperties(msg)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", msg, err)
		}
		back, err := decodeProperties(again)
		if err != nil {
			t.Fatalf("re-encoded bytes do not decode: %v", err)
		}
		if diff := comparePublishing(msg, back); diff != "" {
			t.Fatal(diff)
		}
	})
}

// comparePublishing describes how got differs from want, "" if it does
// not. Floats compare by bits (NaN equals itself); times by instant.
func comparePublishing(want, got amqp.Publishing) string {
	if !want.Timestamp.Equal(got.Timestamp) {
		return fmt.Sprintf("Timestamp %v, want %v", got.Timestamp, want.Timestamp)
	}
	wh, gh := want.Headers, got.Headers
	want.Timestamp, got.Timestamp, want.Headers, got.Headers = time.Time{}, time.Time{}, nil, nil
	if len(want.Body) == 0 && len(got.Body) == 0 {
		want.Body, got.Body = nil, nil
	}
	if !reflect.DeepEqual(want, got) {
		return fmt.Sprintf("properties %+v, want %+v", got, want)
	}
	if len(wh) == 0 && len(gh) == 0 {
		return ""
	}
	return compareValue("headers", wh, gh)
}

func compareValue(path string, want, got any) string {
	if reflect.TypeOf(want) != reflect.TypeOf(got) {
		return fmt.Sprintf("%s: %T %v, want %T %v", path, got, got, want, want)
	}
	switch w := want.(type) {
	case float32:
		if math.Float32bits(w) != math.Float32bits(got.(float32)) {
			return fmt.Sprintf("%s: %v, want %v", path, got, want)
		}
	case float64:
		if math.Float64bits(w) != math.Float64bits(got.(float64)) {
			return fmt.Sprintf("%s: %v, want %v", path, got, want)
		}
	case time.Time:
		if !w.Equal(got.(time.Time)) {
			return fmt.Sprintf("%s: %v, want %v", path, got, want)
		}
	case amqp.Table:
		g := got.(amqp.Table)
		if len(w) != len(g) {
			return fmt.Sprintf("%s: %d keys %v, want %d %v", path, len(g), g, len(w), w)
		}
		for k, v := range w {
			gv, ok := g[k]
			if !ok {
				return fmt.Sprintf("%s: key %q missing", path, k)
			}
			if d := compareValue(path+"."+k, v, gv); d != "" {
				return d
			}
		}
	case []any:
		g := got.([]any)
		if len(w) != len(g) {
			return fmt.Sprintf("%s: %d elements, want %d", path, len(g), len(w))
		}
		for i := range w {
			if d := compareValue(fmt.Sprintf("%s[%d]", path, i), w[i], g[i]); d != "" {
				return d
			}
		}
	default:
		if !reflect.DeepEqual(want, got) {
			return fmt.Sprintf("%s: %#v, want %#v", path, got, want)
		}
	}
	return ""
}
