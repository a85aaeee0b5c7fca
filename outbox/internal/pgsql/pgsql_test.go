package pgsql

import (
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://app:s3cret@db:5432/x", "postgres://app:xxxxx@db:5432/x"},
		{"failed: postgresql://app:p@ss@w0rd@db/x?sslmode=disable here", "failed: postgresql://app:xxxxx@db/x?sslmode=disable here"},
		{"host=db user=app password=s3cret dbname=x", "host=db user=app password=xxxxx dbname=x"},
		{"host=db password='se cret' dbname=x", "host=db password=xxxxx dbname=x"},
		{"PASSWORD = hunter2", "PASSWORD = xxxxx"},
		{"postgres://app@db/x", "postgres://app@db/x"},
		{"nothing to hide", "nothing to hide"},
	} {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseTable(t *testing.T) {
	for _, tc := range []struct {
		in, quoted string
		ok         bool
	}{
		{"amqpretry_outbox", `"amqpretry_outbox"`, true},
		{"app.outbox", `"app"."outbox"`, true},
		{"Outbox", "", false},
		{"out box", "", false},
		{`x"; drop table y; --`, "", false},
		{"a.b.c", "", false},
		{"", "", false},
		{"1abc", "", false},
		{strings.Repeat("a", 49), "", false},
	} {
		got, err := ParseTable(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got.Quoted != tc.quoted) {
			t.Errorf("ParseTable(%q) = %q, %v; want %q, ok=%v", tc.in, got.Quoted, err, tc.quoted, tc.ok)
		}
	}
}
