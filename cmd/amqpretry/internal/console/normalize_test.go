package console

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestNormalize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"customer 1234 not found", "customer <n> not found"},
		{"customer 98 not found", "customer <n> not found"},
		{"order 3f2c1a9e-7b4d-4c1e-9a2b-0123456789ab: duplicate", "order <uuid>: duplicate"},
		{"ORDER 3F2C1A9E-7B4D-4C1E-9A2B-0123456789AB", "ORDER <uuid>"},
		{"object 507f1f77bcf86cd799439011 missing", "object <hex> missing"},
		{"sha 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "sha <hex>"},
		{"pointer 0xc000123abc freed", "pointer <hex> freed"},
		{"took 1.5s, limit 30s", "took <n>.<n>s, limit <n>s"},
		{"item42 and v2 of utf8", "item<n> and v<n> of utf<n>"},
		{"deadbeef and cafebabe", "deadbeef and cafebabe"}, // hex-looking words without a digit stay
		{"12345678 is a number", "<n> is a number"},
		{"  spaced\tout\n\nlines  ", "spaced out lines"},
		{"naïve café 12 €", "naïve café <n> €"},
		{"not a uuid 3f2c1a9e-7b4d-4c1e-9a2b-0123456789abc", "not a uuid <hex>-<n>b<n>d-<n>c<n>e-<n>a<n>b-<hex>"},
		{"bad \xff byte 7", "bad \xff byte <n>"},
		{"", ""},
	} {
		if got := Normalize(tc.in); got != tc.want {
			t.Errorf("Normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestNormalizeBoundsItsResult(t *testing.T) {
	got := Normalize(strings.Repeat("é word ", 1000))
	if len(got) > maxSignature || !utf8.ValidString(got) {
		t.Errorf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
}

// Normalize never panics, never lets a digit through, is idempotent, stays
// within maxSignature and keeps valid UTF-8 valid.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"customer 1234 not found", "3f2c1a9e-7b4d-4c1e-9a2b-0123456789ab", "0xdeadbeef1", "a\u202eb\x00c", "\xff\xfe12"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := Normalize(s)
		if len(n) > maxSignature {
			t.Fatalf("%d bytes", len(n))
		}
		if strings.ContainsAny(n, "0123456789") {
			t.Fatalf("Normalize(%q) = %q keeps a digit", s, n)
		}
		if again := Normalize(n); again != n {
			t.Fatalf("not idempotent: %q, then %q", n, again)
		}
		if utf8.ValidString(s) && !utf8.ValidString(n) {
			t.Fatalf("Normalize(%q) = %q is not UTF-8", s, n)
		}
	})
}

func TestGroups(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2025, 3, 1, 12, 0, s, 0, time.UTC) }
	msgs := []*Message{
		{Key: "id:a", OriginalQueue: "orders", ErrorType: "*app.NotFound", Exception: "customer 1 not found", FailedAt: at(5)},
		{Key: "id:b", OriginalQueue: "orders", ErrorType: "*app.NotFound", Exception: "customer 22 not found", FailedAt: at(1)},
		{Key: "id:c", OriginalQueue: "billing", ErrorType: "*app.NotFound", Exception: "customer 3 not found", FailedAt: at(3)},
		{Key: "id:d", OriginalQueue: "orders", ErrorType: "*app.Timeout", Exception: "customer 4 not found", Stack: "x.go:12"},
		{Key: "id:d", OriginalQueue: "orders", ErrorType: "*app.NotFound", Exception: "customer 5 not found", FailedAt: at(9)},
	}
	groups := Groups(msgs, ByCause)
	if len(groups) != 3 {
		t.Fatalf("%d groups, want 3 (queue and error type split a cause)", len(groups))
	}
	g := groups[0]
	if g.Count() != 3 || g.OriginalQueue != "orders" || g.Signature != "customer <n> not found" || g.Example != "customer 1 not found" ||
		!g.FirstFailed.Equal(at(1)) || !g.LastFailed.Equal(at(9)) {
		t.Errorf("largest group: %+v", g)
	}
	if keys := g.Keys(); len(keys) != 3 || keys["id:d"] != 1 {
		t.Errorf("keys %v", keys)
	}
	if again := Groups(msgs, ByCause); again[0].ID != g.ID || again[1].ID != groups[1].ID {
		t.Error("group ids change between groupings")
	}
	if byStack := Groups(msgs, ByStack); len(byStack) != 3 || byStack[0].ID == g.ID {
		t.Errorf("by stack: %d groups, first id %s (by cause %s)", len(byStack), byStack[0].ID, g.ID)
	}
}

// A message without an id is known by a fingerprint that a look does not
// change: a quorum queue's x-delivery-count is left out of it.
func TestKeyFingerprint(t *testing.T) {
	d := amqp.Delivery{Body: []byte("body"), Headers: amqp.Table{"x-exception-message": "boom", "n": int32(1), "t": amqp.Table{"b": "2", "a": "1"}}}
	k := Key(&d)
	if !strings.HasPrefix(k, "fp:") || len(k) != 3+32 {
		t.Fatalf("key %q", k)
	}
	looked := d
	looked.Headers = amqp.Table{"x-exception-message": "boom", "n": int32(1), "t": amqp.Table{"a": "1", "b": "2"}, "x-delivery-count": int64(3)}
	looked.Redelivered = true
	if Key(&looked) != k {
		t.Error("a look changed the fingerprint")
	}
	other := d
	other.Body = []byte("bodY")
	typed := d
	typed.Headers = amqp.Table{"x-exception-message": "boom", "n": int64(1), "t": amqp.Table{"b": "2", "a": "1"}}
	if Key(&other) == k || Key(&typed) == k {
		t.Error("different messages share a fingerprint")
	}
	d.MessageId = "order-7"
	if Key(&d) != "id:order-7" {
		t.Errorf("with an id: %q", Key(&d))
	}
}

// Ref keeps every key's bytes out of a page's attributes but printable
// ASCII, and Unref gets the key back.
func FuzzRef(f *testing.F) {
	for _, s := range []string{"id:order-1", "id:evil\u202e", "b64:aGk", "id:\x00\xff", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		ref := Ref(key)
		for i := range len(ref) {
			if ref[i] < 0x20 || ref[i] > 0x7e {
				t.Fatalf("Ref(%q) = %q holds byte %#x", key, ref, ref[i])
			}
		}
		if Unref(ref) != key {
			t.Fatalf("Unref(Ref(%q)) = %q", key, Unref(ref))
		}
	})
}
