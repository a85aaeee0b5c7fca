package amqpurl_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/amqpurl"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRedact(t *testing.T) {
	tests := []struct{ in, want string }{
		{"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"amqps://app:s3cr%2Ft@mq.example.com/prod", "amqps://app:xxxxx@mq.example.com/prod"},
		{"amqp://app:pa/ss@host/", "amqp://app:xxxxx@host/"},          // unescaped slash
		{"amqp://app:p@ss@host/", "amqp://app:xxxxx@host/"},           // unescaped at
		{"amqp://app:secret@host:bad/", "amqp://app:xxxxx@host:bad/"}, // does not parse
		{"amqp://host:5672/vhost", "amqp://host:5672/vhost"},          // no credentials
		{"amqp://user@host/", "amqp://user@host/"},                    // no password
		{"amqp://app:000#@host/", "amqp://app:xxxxx@host/"},           // unescaped hash (found by FuzzRedact)
		{"amqp://u:p@host/?certfile=a@b", "amqp://u:xxxxx@b"},         // hides too much rather than too little
		{"", ""},
	}
	for _, tt := range tests {
		if got := amqpurl.Redact(tt.in); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseErrorsHidePasswords(t *testing.T) {
	for _, raw := range []string{
		"amqp://app:topsecret@host:bad/",
		"http://app:topsecret@host/",
		"amqp://app:topsecret@host/ with space",
		"amqp://app:topsecret/x@host/",  // url.Parse quotes ":topsecret" as a bad port
		"amqp://app:top%zzsecret@host/", // and a bad escape as "%zz"
		"amqp://app:topsecret@host/?heartbeat=often",
	} {
		_, err := amqpurl.Parse(raw)
		if err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", raw)
			continue
		}
		if strings.Contains(err.Error(), "topsecret") || strings.Contains(err.Error(), "secret") {
			t.Errorf("Parse(%q) error leaks the password: %v", raw, err)
		}
	}
}

func TestParse(t *testing.T) {
	uri, err := amqpurl.Parse("amqps://app:pw@mq.example.com/prod")
	if err != nil || uri.Scheme != "amqps" || uri.Port != 5671 || uri.Vhost != "prod" {
		t.Fatalf("Parse = %+v, %v", uri, err)
	}
	if amqpurl.IsLoopback(uri) {
		t.Error("mq.example.com is not loopback")
	}
	local, _ := amqpurl.Parse(amqpurl.Default)
	if !amqpurl.IsLoopback(local) {
		t.Error("the default URL is loopback")
	}
}

// FuzzRedact: whatever the password holds, Redact replaces exactly it. The
// user name may not hold ":" or "@" and the host may not hold "@", as in any
// URL that amqp091 could use.
func FuzzRedact(f *testing.F) {
	f.Add("guest", "guest", "127.0.0.1:5672")
	f.Add("app", "pa/ss@w:rd", "host")
	f.Add("0", "000#", "0")
	f.Add("", "longpassword", "h")
	f.Fuzz(func(t *testing.T, user, password, host string) {
		if strings.ContainsAny(user, ":@") || strings.Contains(host, "@") {
			return
		}
		raw := "amqp://" + user + ":" + password + "@" + host + "/"
		want := "amqp://" + user + ":xxxxx@" + host + "/"
		if got := amqpurl.Redact(raw); got != want {
			t.Fatalf("Redact(%q) = %q, want %q", raw, got, want)
		}
	})
}

// FuzzParse: whatever the URL, Parse neither panics nor quotes the password
// in its error.
func FuzzParse(f *testing.F) {
	f.Add("amqp", "guest", "guest", "127.0.0.1:5672", "/")
	f.Add("amqps", "app", "p@ss/w:rd%zz", "host:bad", "/vhost?heartbeat=x")
	f.Add("http", "u", "secret", "h", "")
	f.Fuzz(func(t *testing.T, scheme, user, password, host, rest string) {
		if len(password) < 6 || strings.Contains(scheme+user+host+rest, password) || strings.Contains("amqp://xxxxx", password) {
			return // too short or too common to look for
		}
		raw := scheme + "://" + user + ":" + password + "@" + host + rest
		if strings.Contains(fmt.Sprintf("%q", amqpurl.Redact(raw)), password) {
			return // the quoted URL spells it by chance (an escape like \x90 then zeros)
		}
		_, err := amqpurl.Parse(raw)
		if err == nil {
			return
		}
		// The redacted URL the error quotes and the text after it may spell
		// the password by chance across their boundary (a host 0000, then
		// the closing quote and a colon, spell the password 0000":): what
		// must not hold it is each part of the error around that URL.
		for _, part := range strings.Split(err.Error(), fmt.Sprintf("%q", amqpurl.Redact(raw))) {
			if strings.Contains(part, password) {
				t.Fatalf("Parse(%q) error quotes the password: %v", raw, err)
			}
		}
	})
}

func TestSplitList(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"amqp://a/", []string{"amqp://a/"}},
		{"amqp://u:p@a:5672/,amqp://u:p@b:5672/,amqps://u:p@c:5671/", []string{"amqp://u:p@a:5672/", "amqp://u:p@b:5672/", "amqps://u:p@c:5671/"}},
		{" amqp://a/ , amqp://b/ ", []string{"amqp://a/", "amqp://b/"}},
		{"amqp://u:pa,ss,word@a/,amqp://u:pa,ss,word@b/", []string{"amqp://u:pa,ss,word@a/", "amqp://u:pa,ss,word@b/"}},
		{"amqp://u:p,amqp@a/", []string{"amqp://u:p,amqp@a/"}},
		{"amqp://a/,", []string{"amqp://a/", ""}},
		{"amqp://a/,,amqp://b/", []string{"amqp://a/", "", "amqp://b/"}},
		{" , ", []string{"", ""}},
	} {
		if got := amqpurl.SplitList(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("SplitList(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
