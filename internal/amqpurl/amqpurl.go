package amqpurl

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Default is the broker the project's scripts and tests use when $AMQP_URL is
// not set.
const Default = "amqp://guest:guest@127.0.0.1:5672/"

const mask = "xxxxx"

// Redact replaces the password in an AMQP URL with xxxxx. It works on the raw
// text, so it also hides the password of a URL that does not parse: a
// password may hold any unescaped character ("/", "@", "#", "?"), so
// everything from the first ":" after the scheme to the last "@" is hidden.
// When a query value also holds an "@" that hides more than the password,
// which is the safe side to err on.
func Redact(raw string) string {
	start := 0
	if i := strings.Index(raw, "://"); i >= 0 {
		start = i + len("://")
	}
	rest := raw[start:]
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return raw
	}
	colon := strings.Index(rest[:at], ":")
	if colon < 0 {
		return raw // a user name without a password
	}
	return raw[:start+colon+1] + mask + raw[start+at:]
}

// Parse parses an amqp:// or amqps:// URL. Its errors never contain the
// password.
func Parse(raw string) (amqp.URI, error) {
	uri, err := amqp.ParseURI(raw)
	if err != nil {
		// Parsers quote what they could not read (a port, an escape), and that
		// can be a piece of the password: say what is wrong in our own words.
		why := "it does not parse; percent-encode reserved characters such as / @ : ? # in the user name and password"
		switch {
		case strings.HasPrefix(err.Error(), "AMQP scheme"):
			why = "the scheme must be amqp:// or amqps://"
		case strings.Contains(err.Error(), "whitespace"):
			why = "it must not contain whitespace"
		case !errors.As(err, new(*url.Error)) && strings.Contains(err.Error(), " is not "):
			why = "a query parameter (heartbeat, connection_timeout, channel_max) has an invalid value"
		}
		return amqp.URI{}, fmt.Errorf("invalid AMQP URL %q: %s (want amqp://user:password@host:port/vhost or amqps://...)", Redact(raw), why)
	}
	return uri, nil
}

// IsLoopback reports whether the URL's host is this machine, where a missing
// broker can be started.
func IsLoopback(uri amqp.URI) bool {
	switch uri.Host {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	return strings.HasPrefix(uri.Host, "127.")
}

// SplitList splits a comma-separated list of AMQP URLs, the nodes of a
// cluster: "amqp://u:p@a/,amqp://u:p@b/". It splits at a comma followed by
// amqp:// or amqps://, so a comma in a password needs no escaping, and at a
// comma followed by another comma or by the end, which leaves an empty
// element for the caller to refuse. Spaces around each URL are dropped.
func SplitList(list string) []string {
	var urls []string
	start := 0
	for i := range len(list) {
		if list[i] != ',' {
			continue
		}
		after := strings.TrimLeft(list[i+1:], " ")
		if after == "" || after[0] == ',' || strings.HasPrefix(after, "amqp://") || strings.HasPrefix(after, "amqps://") {
			urls = append(urls, strings.TrimSpace(list[start:i]))
			start = i + 1
		}
	}
	if last := strings.TrimSpace(list[start:]); last != "" || len(urls) > 0 {
		urls = append(urls, last)
	}
	return urls
}
