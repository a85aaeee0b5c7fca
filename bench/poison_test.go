package main

import (
	"testing"

	"github.com/amqpretry/amqpretry/recoverer"
)

// TestFaultHeadersAreTheRecoverersOwn: raw-annotated must carry what the
// listener's copies carry, or it measures something else.
func TestFaultHeadersAreTheRecoverersOwn(t *testing.T) {
	h, err := faultHeaders("orders")
	if err != nil {
		t.Fatal(err)
	}
	p := recoverer.DefaultHeaderPrefix
	for _, key := range []string{recoverer.HeaderExceptionMessage, recoverer.HeaderExceptionStacktrace,
		recoverer.HeaderOriginalExchange, recoverer.HeaderOriginalRoutingKey,
		p + recoverer.SuffixOriginalQueue, p + recoverer.SuffixErrorType, p + recoverer.SuffixAttempts,
		p + recoverer.SuffixFailedAt, p + recoverer.SuffixHost} {
		if _, ok := h[key]; !ok {
			t.Errorf("no %s in %v", key, h)
		}
	}
	if got := h[p+recoverer.SuffixOriginalQueue]; got != "orders" {
		t.Errorf("original queue %v, want orders", got)
	}
	if got := h[recoverer.HeaderExceptionMessage]; got != errPoison.Error() {
		t.Errorf("exception message %v, want %q", got, errPoison.Error())
	}
}
