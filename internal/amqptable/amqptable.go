package amqptable

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Normalize returns t ready to publish: Go int, uint and uint64 values (at any
// depth) become int64, since amqp091 writes an int as a 32-bit field and
// would silently cut 1<<40 to 0; map[string]any becomes amqp.Table. The
// result is then checked with amqp.Table.Validate. t itself is never
// modified; when nothing needs changing, t is returned as is.
func Normalize(t amqp.Table) (amqp.Table, error) {
	if flat(t) {
		return t, nil // the common case, in one pass instead of three
	}
	if err := checkShape(t, 0); err != nil {
		return nil, err
	}
	out, _, err := normalizeTable(t)
	if err != nil {
		return nil, err
	}
	if err := out.Validate(); err != nil {
		return nil, fmt.Errorf("headers cannot be encoded in AMQP: %w", err)
	}
	return out, nil
}

// flat reports a table that Normalize would return as is without looking
// further: no more than MaxEntries entries, names no longer than a short
// string, and only scalar values that amqp.Table.Validate accepts and
// Normalize leaves alone (an int, which it widens, is not one).
func flat(t amqp.Table) bool {
	if len(t) > MaxEntries {
		return false
	}
	for k, v := range t {
		if len(k) > MaxShortString {
			return false
		}
		switch v.(type) {
		case nil, bool, byte, int8, int16, int32, int64, uint16, uint32, float32, float64, string, []byte, amqp.Decimal, time.Time:
		default:
			return false
		}
	}
	return true
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

// MaxDepth bounds how deeply tables and arrays may nest in headers, counted
// as amqp091-go counts when it reads a frame: the header table is level 0,
// a table or array inside it level 1, and so on; amqp091-go refuses a frame
// with a container below level 32. Deeper is refused here too, which also
// catches a table that contains itself (amqp091 would recurse until the
// stack overflows). Scalars add no level: a table at level 32 may hold
// strings and numbers.
const MaxDepth = 32

// MaxEntries bounds the entries of a table and the elements of an array, as
// amqp091-go's reader does (read.go, maxContainerElements): more, and it
// refuses the frame and closes the connection.
const MaxEntries = 8192

// MaxShortString is the longest AMQP short string: header names, exchange and
// routing key, and the string properties.
const MaxShortString = 255

// checkShape refuses header names longer than a short string and containers
// nested below MaxDepth; depth is v's level when v is a container.
func checkShape(v any, depth int) error {
	switch x := v.(type) {
	case amqp.Table:
		if depth > MaxDepth {
			return errTooDeep
		}
		if len(x) > MaxEntries {
			return errTooMany
		}
		for k, e := range x {
			if len(k) > MaxShortString {
				return fmt.Errorf("header name %.40q… is %d bytes, over AMQP's limit of %d", k, len(k), MaxShortString)
			}
			if err := checkShape(e, depth+1); err != nil {
				return err
			}
		}
	case map[string]any:
		return checkShape(amqp.Table(x), depth)
	case []any:
		if depth > MaxDepth {
			return errTooDeep
		}
		if len(x) > MaxEntries {
			return errTooMany
		}
		for _, e := range x {
			if err := checkShape(e, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

var errTooMany = fmt.Errorf("a header table or array has more than %d entries, which amqp091-go cannot read back", MaxEntries)

var errTooDeep = fmt.Errorf("headers nest tables or arrays deeper than %d levels, which amqp091-go cannot read back (does a table contain itself?)", MaxDepth)

// NormalizeDropping is Normalize for a copy that must be published whatever
// its headers hold (a dead letter, a retry): a header Normalize would refuse
// (nested too deep or too wide, a cycle, a type AMQP lacks, a uint64 past
// int64, a name over 255 bytes) is left out, and its name returned in
// dropped, sorted. More than MaxEntries headers are left to the caller.
func NormalizeDropping(t amqp.Table) (out amqp.Table, dropped []string) {
	if out, err := Normalize(t); err == nil {
		return out, nil
	}
	out = make(amqp.Table, len(t))
	for k, v := range t {
		one, err := Normalize(amqp.Table{k: v})
		if err != nil {
			dropped = append(dropped, k)
			continue
		}
		out[k] = one[k]
	}
	slices.Sort(dropped)
	return out, dropped
}

// FrameOverhead is what a content header frame spends besides the property
// list: the frame's type, channel, size and end octets (8) and the class,
// weight, body size and property flags (14).
const FrameOverhead = 22

// PropertiesSize is the encoded size of a message's property list, headers
// included, as amqp091 writes it: a content header frame holds it whole, so
// it must not exceed frame_max - FrameOverhead.
func PropertiesSize(p amqp.Publishing) int {
	n := 0
	for _, s := range []string{p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo,
		p.Expiration, p.MessageId, p.Type, p.UserId, p.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if len(p.Headers) > 0 {
		n += Size(p.Headers)
	}
	if p.DeliveryMode > 0 {
		n++
	}
	if p.Priority > 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// CheckShortStrings reports the first string property longer than an AMQP
// short string; amqp091 would fail to encode it and close the connection.
func CheckShortStrings(p amqp.Publishing) error {
	for _, f := range []struct{ name, value string }{
		{"content-type", p.ContentType}, {"content-encoding", p.ContentEncoding},
		{"correlation-id", p.CorrelationId}, {"reply-to", p.ReplyTo}, {"expiration", p.Expiration},
		{"message-id", p.MessageId}, {"type", p.Type}, {"user-id", p.UserId}, {"app-id", p.AppId},
	} {
		if len(f.value) > MaxShortString {
			return fmt.Errorf("property %s is %d bytes, over AMQP's limit of %d", f.name, len(f.value), MaxShortString)
		}
	}
	return nil
}

// Publishing is d's body and properties as a publishing, headers included
// (the same table: copy it before changing it) and expiration excluded: a
// copy of a message published elsewhere must not inherit a TTL that may
// already have run out. Callers adjust the rest (delivery mode, user-id).
func Publishing(d *amqp.Delivery) amqp.Publishing {
	return amqp.Publishing{
		Headers:         d.Headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserId:          d.UserId,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// MaxExpiration is the largest per-message TTL RabbitMQ accepts, in
// milliseconds (ten years), as measured on 3.10, 4.0 and 4.3.
const MaxExpiration = 315360000000

// CheckExpiration refuses an expiration property RabbitMQ would refuse by
// closing the channel (406 PRECONDITION_FAILED, "invalid expiration"): it
// takes an optional sign and decimal digits (Erlang's string:to_integer)
// whose value is 0 to MaxExpiration. "" means no expiration.
func CheckExpiration(s string) error {
	if s == "" {
		return nil
	}
	number, negative := s, false
	if s[0] == '+' || s[0] == '-' {
		number, negative = s[1:], s[0] == '-'
	}
	if number == "" || strings.Trim(number, "0123456789") != "" {
		return fmt.Errorf("expiration %q is not a whole number of milliseconds: RabbitMQ takes decimal digits only, such as \"60000\"", s)
	}
	digits := strings.TrimLeft(number, "0")
	switch n, err := strconv.ParseInt(digits, 10, 64); {
	case digits == "":
		return nil // zero, whatever its sign
	case negative:
		return fmt.Errorf("expiration %q is negative: RabbitMQ takes 0 to %d milliseconds", s, int64(MaxExpiration))
	case err != nil || n > MaxExpiration:
		return fmt.Errorf("expiration %q is more than the %d milliseconds (ten years) RabbitMQ takes", s, int64(MaxExpiration))
	}
	return nil
}
