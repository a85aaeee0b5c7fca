package typed_test

import (
	"context"
	"encoding/json"
	"errors"
	"mime"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/typed"
)

// Whatever the content type and body, the handler never panics; it calls
// the function exactly when the content type is JSON's (or absent) and the
// body decodes, and otherwise returns a Permanent *DecodeError that says
// which of the two failed. Where the standard library's MIME parser reads
// the content type, it agrees on the media type.
func FuzzHandler(f *testing.F) {
	for _, seed := range []struct{ ct, body string }{
		{"", `{"id":"o-1","total":1}`},
		{"application/json; charset=utf-8", `{"id":"o-1"}`},
		{"application/vnd.acme+json", `[]`},
		{"text/plain", `{}`},
		{"APPLICATION/JSON", "{\"id\":\"\xff\"}"},
		{"application/+json", `{}`},
		{" ;", `null`},
		{"application/json\x00", `{"total":1e400}`},
	} {
		f.Add(seed.ct, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		called := false
		h := typed.Handler(func(context.Context, order, *amqp.Delivery) error {
			called = true
			return nil
		})
		err := h(context.Background(), &amqp.Delivery{ContentType: contentType, Body: body})

		var o order
		decodes := json.Unmarshal(body, &o) == nil
		media := strings.ToLower(strings.TrimSpace(strings.SplitN(contentType, ";", 2)[0]))
		accepted := media == "" || media == "application/json" || jsonSuffixed(media)
		if mt, _, perr := mime.ParseMediaType(contentType); perr == nil && mt != media {
			t.Fatalf("content type %q: the MIME parser reads %q, the handler %q", contentType, mt, media)
		}

		if called != (accepted && decodes) || (err == nil) != called {
			t.Fatalf("content type %q, body %q: called %v, err %v; want called %v (accepted %v, decodes %v)", contentType, body, called, err, accepted && decodes, accepted, decodes)
		}
		if err == nil {
			return
		}
		var de *typed.DecodeError
		if !middleware.IsPermanent(err) || !errors.As(err, &de) || de.ContentType != contentType {
			t.Fatalf("err = %v, want a Permanent *DecodeError of content type %q", err, contentType)
		}
		if errors.Is(err, typed.ErrContentType) == accepted {
			t.Fatalf("content type %q accepted %v, but err = %v", contentType, accepted, err)
		}
		_ = err.Error()
	})
}

// jsonSuffixed reports whether media is type/subtype+json with a non-empty
// subtype before the suffix.
func jsonSuffixed(media string) bool {
	typ, sub, ok := strings.Cut(media, "/")
	return ok && typ != "" && strings.HasSuffix(sub, "+json") && len(sub) > len("+json")
}
