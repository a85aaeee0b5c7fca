package amqptable_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/amqptable"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNormalizeWidensInts(t *testing.T) {
	in := amqp.Table{
		"big":    1 << 40,
		"small":  7,
		"uint":   uint(3),
		"nested": amqp.Table{"n": 1 << 33},
		"map":    map[string]any{"m": 5},
		"array":  []any{"a", 1 << 35},
		"keep":   int32(9),
		"s":      "x",
	}
	out, err := amqptable.Normalize(in)
	if err != nil {
		t.Fatal(err)
	}
	checks := map[string]any{
		"big": int64(1 << 40), "small": int64(7), "uint": int64(3), "keep": int32(9), "s": "x",
	}
	for k, want := range checks {
		if out[k] != want {
			t.Errorf("%s = %#v, want %#v", k, out[k], want)
		}
	}
	if got := out["nested"].(amqp.Table)["n"]; got != int64(1<<33) {
		t.Errorf("nested = %#v", got)
	}
	if got := out["map"].(amqp.Table)["m"]; got != int64(5) {
		t.Errorf("map = %#v", got)
	}
	if got := out["array"].([]any)[1]; got != int64(1<<35) {
		t.Errorf("array = %#v", got)
	}
	if in["big"] != 1<<40 || in["nested"].(amqp.Table)["n"] != 1<<33 {
		t.Error("Normalize modified its argument")
	}
}

func TestNormalizeLeavesCleanTablesAlone(t *testing.T) {
	in := amqp.Table{"a": "b", "n": int64(1), "t": amqp.Table{"x": true}}
	out, err := amqptable.Normalize(in)
	if err != nil {
		t.Fatal(err)
	}
	in["probe"] = 1 // same map: the write shows through
	if _, ok := out["probe"]; !ok {
		t.Error("a table that needs no change must be returned without copying")
	}
}

func TestNormalizeRejects(t *testing.T) {
	for name, table := range map[string]amqp.Table{
		"unsupported type": {"f": struct{}{}},
		"uint64 overflow":  {"u": uint64(math.MaxUint64)},
		"nested bad":       {"t": amqp.Table{"s": []string{"a"}}},
	} {
		if _, err := amqptable.Normalize(table); err == nil {
			t.Errorf("%s: Normalize accepted %v", name, table)
		}
	}
}

// Sizes from the AMQP 0-9-1 field-table grammar: a key is a short string
// (1 length byte), a value is a type tag plus its payload.
func TestSize(t *testing.T) {
	tests := []struct {
		name  string
		value any
		want  int // field size: tag + payload
	}{
		{"nil", nil, 1},
		{"bool", true, 2},
		{"byte", byte(1), 2},
		{"int8", int8(-1), 2},
		{"int16", int16(2), 3},
		{"uint16", uint16(3), 3},
		{"int32", int32(4), 5},
		{"uint32", uint32(5), 5},
		{"float32", float32(1.5), 5},
		{"int64", int64(6), 9},
		{"float64", 2.5, 9},
		{"time", time.Unix(1700000000, 0), 9},
		{"decimal", amqp.Decimal{Scale: 2, Value: 12345}, 6},
		{"string counts bytes, not runes", "héllo", 5 + 6},
		{"bytes", []byte{1, 2, 3}, 5 + 3},
		{"empty table", amqp.Table{}, 1 + 4},
		{"table", amqp.Table{"k": "v"}, 1 + 4 + (1 + 1) + (5 + 1)},
		{"array", []any{"a", int64(1), []any{true}}, 5 + (5 + 1) + 9 + (5 + 2)},
		{"unsupported counts as nothing", struct{}{}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := amqptable.FieldSize(tt.value); got != tt.want {
				t.Errorf("FieldSize = %d, want %d", got, tt.want)
			}
			table := amqp.Table{"key": tt.value}
			if got, want := amqptable.Size(table), 4+(1+3)+tt.want; got != want {
				t.Errorf("Size = %d, want %d", got, want)
			}
		})
	}
	if got := amqptable.Size(amqp.Table{"long": strings.Repeat("é", 5000)}); got != 4+5+5+10000 {
		t.Errorf("Size of a 10000-byte string = %d", got)
	}
}

func TestNormalizeRefusesBadShapes(t *testing.T) {
	cyclic := amqp.Table{}
	cyclic["self"] = cyclic
	deep := amqp.Table{}
	for range amqptable.MaxDepth + 2 {
		deep = amqp.Table{"d": deep}
	}
	for name, table := range map[string]amqp.Table{
		"cycle":            cyclic,
		"too deep":         deep,
		"long name":        {strings.Repeat("k", 256): "v"},
		"long name inside": {"t": amqp.Table{strings.Repeat("k", 300): 1}},
	} {
		if _, err := amqptable.Normalize(table); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := amqptable.Normalize(amqp.Table{strings.Repeat("k", 255): "v"}); err != nil {
		t.Errorf("a 255-byte name is allowed: %v", err)
	}
}

func TestPropertiesSize(t *testing.T) {
	p := amqp.Publishing{
		ContentType: "application/json", MessageId: "m1", DeliveryMode: 2, Priority: 1,
		Timestamp: time.Unix(1, 0), Headers: amqp.Table{"k": "v"},
	}
	want := (1 + 16) + (1 + 2) + 1 + 1 + 8 + amqptable.Size(p.Headers)
	if got := amqptable.PropertiesSize(p); got != want {
		t.Errorf("PropertiesSize = %d, want %d", got, want)
	}
	if amqptable.PropertiesSize(amqp.Publishing{Headers: amqp.Table{}}) != 0 {
		t.Error("an empty table is not written")
	}
	if err := amqptable.CheckShortStrings(amqp.Publishing{MessageId: strings.Repeat("x", 256)}); err == nil || !strings.Contains(err.Error(), "message-id") {
		t.Errorf("CheckShortStrings = %v", err)
	}
}

// FuzzNormalize builds nested tables from fuzz input: Normalize never panics,
// and what it accepts is valid AMQP with no Go int left.
func FuzzNormalize(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, int64(1<<40), "key")
	f.Add([]byte{9, 9, 9, 0, 200}, int64(-1), strings.Repeat("k", 300))
	f.Fuzz(func(t *testing.T, shape []byte, n int64, key string) {
		table := amqp.Table{}
		cur := table
		for i, b := range shape {
			k := fmt.Sprint(key, i)
			switch b % 8 {
			case 0:
				next := amqp.Table{}
				cur[k] = next
				cur = next
			case 1:
				cur[k] = int(n)
			case 2:
				cur[k] = uint64(n)
			case 3:
				cur[k] = []any{int(n), "s", map[string]any{"m": int(n)}}
			case 4:
				cur[k] = struct{}{}
			case 5:
				cur[k] = key
			case 6:
				cur[key] = cur // a cycle
			case 7:
				cur[k] = map[string]any{key: n}
			}
		}
		out, err := amqptable.Normalize(table)
		if err != nil {
			return
		}
		if err := out.Validate(); err != nil {
			t.Fatalf("accepted an invalid table: %v", err)
		}
		var walk func(v any)
		walk = func(v any) {
			switch x := v.(type) {
			case int, uint, uint64, map[string]any:
				t.Fatalf("a %T survived Normalize", x)
			case amqp.Table:
				for _, e := range x {
					walk(e)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			}
		}
		walk(out)
	})
}

// What RabbitMQ 3.10.8, 4.0.5 and 4.3.6 do with each expiration, measured:
// the broker either takes the message or closes the channel with 406.
func TestCheckExpirationAgreesWithTheBroker(t *testing.T) {
	for exp, takes := range map[string]bool{
		"": true, "0": true, "5": true, "+5": true, "-0": true, "+0": true, "05": true, "00000000000000000000000000005": true,
		"4294967296": true, "315360000000": true,
		"-5": false, " 5": false, "5 ": false, "abc": false, "1.5": false, "0x10": false, "+": false, "-": false,
		"315360000001": false, "9999999999999999999999": false, "٣": false,
	} {
		if err := amqptable.CheckExpiration(exp); (err == nil) != takes {
			t.Errorf("CheckExpiration(%q) = %v; the broker takes it: %v", exp, err, takes)
		}
	}
}

// The depth amqp091-go reads is the depth Normalize takes: it counts the
// header table as level 0 and each table or array inside as one more, up to
// 32, and the values in a level-32 table add none (read.go's maxFieldDepth,
// v1.16.0); recoverer's TestRepublishKeepsHeadersNested32Deep takes such a
// message through a real broker.
func TestNormalizeDepthMatchesAmqp091(t *testing.T) {
	tables := func(n int) amqp.Table {
		v := amqp.Table{"leaf": "x"}
		for range n - 1 {
			v = amqp.Table{"d": v}
		}
		return amqp.Table{"h": v}
	}
	arrays := func(n int) amqp.Table {
		v := []any{"x"}
		for range n - 1 {
			v = []any{v}
		}
		return amqp.Table{"h": v}
	}
	mixed := func(n int) amqp.Table {
		var v any = "x"
		for i := range n {
			if i%2 == 0 {
				v = []any{v}
			} else {
				v = amqp.Table{"d": v}
			}
		}
		return amqp.Table{"h": v}
	}
	for name, build := range map[string]func(int) amqp.Table{"tables": tables, "arrays": arrays, "mixed": mixed} {
		if _, err := amqptable.Normalize(build(amqptable.MaxDepth)); err != nil {
			t.Errorf("%s nested %d deep: %v; amqp091-go reads them", name, amqptable.MaxDepth, err)
		}
		if _, err := amqptable.Normalize(build(amqptable.MaxDepth + 1)); err == nil {
			t.Errorf("%s nested %d deep accepted; amqp091-go refuses them", name, amqptable.MaxDepth+1)
		}
	}
}

func TestNormalizeDropping(t *testing.T) {
	deep := amqp.Table{}
	for range amqptable.MaxDepth + 1 {
		deep = amqp.Table{"d": deep}
	}
	in := amqp.Table{"deep": deep, "odd": struct{}{}, "n": 5, "s": "v", strings.Repeat("k", 256): "v"}
	out, dropped := amqptable.NormalizeDropping(in)
	if want := []string{"deep", strings.Repeat("k", 256), "odd"}; fmt.Sprint(dropped) != fmt.Sprint(want) {
		t.Errorf("dropped %q, want %q", dropped, want)
	}
	if len(out) != 2 || out["n"] != int64(5) || out["s"] != "v" {
		t.Errorf("kept %v, want n (widened) and s", out)
	}
	if err := out.Validate(); err != nil {
		t.Error(err)
	}
	clean := amqp.Table{"a": "b"}
	if out, dropped := amqptable.NormalizeDropping(clean); dropped != nil || len(out) != 1 {
		t.Errorf("a clean table: %v, dropped %v", out, dropped)
	}
}

// amqp091-go's reader takes at most 8,192 entries in a table or an array
// (read.go's maxContainerElements): Normalize refuses more, at any depth.
func TestNormalizeRefusesWhatAmqp091CannotReadBack(t *testing.T) {
	table := func(n int) amqp.Table {
		tab := amqp.Table{}
		for i := range n {
			tab[fmt.Sprint(i)] = int32(i)
		}
		return tab
	}
	array := func(n int) []any { return make([]any, n) }
	for n, ok := range map[int]bool{amqptable.MaxEntries: true, amqptable.MaxEntries + 1: false} {
		for name, h := range map[string]amqp.Table{"headers": table(n), "nested table": {"t": table(n)}, "array": {"a": array(n)}} {
			if _, err := amqptable.Normalize(h); (err == nil) != ok {
				t.Errorf("%s of %d entries: %v", name, n, err)
			}
		}
	}
}
