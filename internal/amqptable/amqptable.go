package amqptable

import (
	"fmt"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Normalize returns t ready to publish: Go int, uint and uint64 values (at any
// depth) become int64, since amqp091 writes an int as a 32-bit field and
// would silently cut 1<<40 to 0; map[string]any becomes amqp.Table. The
// result is then checked with amqp.Table.Validate. t itself is never
// modified; when nothing needs changing, t is returned as is.
func Normalize(t amqp.Table) (amqp.Table, error) {
	out, _, err := normalizeTable(t)
	if err != nil {
		return nil, err
	}
	if err := out.Validate(); err != nil {
		return nil, fmt.Errorf("headers cannot be encoded in AMQP: %w", err)
	}
	return out, nil
}

// normalizeTable copies t only when a value changes.
func normalizeTable(t amqp.Table) (amqp.Table, bool, error) {
	out, copied := t, false
	for k, v := range t {
		nv, changed, err := normalizeValue(v)
		if err != nil {
			return nil, false, fmt.Errorf("header %q: %w", k, err)
		}
		if !changed {
			continue
		}
		if !copied {
			out, copied = make(amqp.Table, len(t)), true
			for k2, v2 := range t {
				out[k2] = v2
			}
		}
		out[k] = nv
	}
	return out, copied, nil
}

func normalizeValue(v any) (any, bool, error) {
	switch x := v.(type) {
	case int:
		return int64(x), true, nil
	case uint:
		if uint64(x) > math.MaxInt64 {
			return nil, false, fmt.Errorf("uint %d does not fit an AMQP signed 64-bit field", x)
		}
		return int64(x), true, nil
	case uint64:
		if x > math.MaxInt64 {
			return nil, false, fmt.Errorf("uint64 %d does not fit an AMQP signed 64-bit field", x)
		}
		return int64(x), true, nil
	case map[string]any:
		t, _, err := normalizeTable(amqp.Table(x))
		return t, true, err
	case amqp.Table:
		return normalizeTable(x)
	case []any:
		var out []any
		for i, e := range x {
			ne, changed, err := normalizeValue(e)
			if err != nil {
				return nil, false, fmt.Errorf("array element %d: %w", i, err)
			}
			if changed && out == nil {
				out = append([]any(nil), x...)
			}
			if out != nil {
				out[i] = ne
			}
		}
		if out == nil {
			return x, false, nil
		}
		return out, true, nil
	}
	return v, false, nil
}

// Size returns the encoded size in bytes of t as a field table, length prefix
// included. Values amqp091 cannot encode count as 0; Normalize rejects them
// first.
func Size(t amqp.Table) int {
	n := 4 // long-uint length prefix
	for k, v := range t {
		n += 1 + len(k) + FieldSize(v)
	}
	return n
}

// FieldSize returns the encoded size of one field value, type tag included.
func FieldSize(v any) int {
	switch x := v.(type) {
	case nil:
		return 1
	case bool, byte, int8:
		return 2
	case int16, uint16:
		return 3
	case int, int32, uint32, float32:
		return 5
	case int64, float64, time.Time:
		return 9
	case amqp.Decimal:
		return 6
	case string:
		return 5 + len(x)
	case []byte:
		return 5 + len(x)
	case amqp.Table:
		return 1 + Size(x)
	case []any:
		n := 5
		for _, e := range x {
			n += FieldSize(e)
		}
		return n
	}
	return 0
}
