package typed_test

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/typed"
)

type order struct {
	ID    string `json:"id" xml:"id"`
	Total int    `json:"total" xml:"total"`
}

// capture returns a typed handler that records the order it was given.
func capture(opts ...typed.Option) (middleware.Handler, *[]order) {
	var got []order
	h := typed.Handler(func(_ context.Context, o order, _ *amqp.Delivery) error {
		got = append(got, o)
		return nil
	}, opts...)
	return h, &got
}

func TestHandlerDecodesJSON(t *testing.T) {
	body := []byte(`{"id":"o-1","total":42}`)
	for _, ct := range []string{"", "application/json", "application/json; charset=utf-8", " Application/JSON ", "application/vnd.acme.order+json", "application/problem+JSON;v=2"} {
		h, got := capture()
		if err := h(context.Background(), &amqp.Delivery{ContentType: ct, Body: body}); err != nil {
			t.Errorf("content type %q: %v", ct, err)
			continue
		}
		if len(*got) != 1 || (*got)[0] != (order{"o-1", 42}) {
			t.Errorf("content type %q: handled %+v, want one order o-1 of 42", ct, *got)
		}
	}
}

// What does not decode is Permanent, carries the decoder's error, and
// never reaches the function.
func TestHandlerRefusesWhatDoesNotDecode(t *testing.T) {
	tests := []struct {
		name        string
		opts        []typed.Option
		contentType string
		body        string
		wantMessage string
		wantType    bool // ErrContentType rather than a decoder's error
	}{
		{"syntax", nil, "application/json", `{"id":`, `typed: cannot decode the body (content type "application/json") into typed_test.order: unexpected end of JSON input`, false},
		{"wrong field type", nil, "", `{"total":"many"}`, `typed: cannot decode the body (content type none) into typed_test.order: json: cannot unmarshal string into Go struct field order.total of type int`, false},
		{"empty body", nil, "application/json", ``, `typed: cannot decode the body (content type "application/json") into typed_test.order: unexpected end of JSON input`, false},
		{"other content type", nil, "text/plain", `{"id":"o-1"}`, `typed: cannot decode the body into typed_test.order: content type "text/plain" is none this handler takes (application/json, +json)`, true},
		{"a bare suffix is no type", nil, "+json", `{}`, `typed: cannot decode the body into typed_test.order: content type "+json" is none this handler takes (application/json, +json)`, true},
		{"a suffix needs a subtype", nil, "application/+json", `{}`, `typed: cannot decode the body into typed_test.order: content type "application/+json" is none this handler takes (application/json, +json)`, true},
		{"required content type", []typed.Option{typed.RequireContentType()}, "", `{}`, `typed: cannot decode the body into typed_test.order: the message has no content type, and this handler requires one of application/json, +json`, true},
		{"xml only", []typed.Option{typed.WithDecoder(xml.Unmarshal, "application/xml")}, "application/json", `{}`, `typed: cannot decode the body into typed_test.order: content type "application/json" is none this handler takes (application/xml)`, true},
		{"a decoder that panics", []typed.Option{typed.WithDecoder(func([]byte, any) error { panic("index out of range") })}, "application/x-thing", `x`, `typed: cannot decode the body (content type "application/x-thing") into typed_test.order: the decoder panicked: index out of range`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, got := capture(tt.opts...)
			err := h(context.Background(), &amqp.Delivery{ContentType: tt.contentType, Body: []byte(tt.body)})
			if len(*got) != 0 {
				t.Errorf("the function was called with %+v", *got)
			}
			var de *typed.DecodeError
			if !middleware.IsPermanent(err) || !errors.Is(err, typed.ErrDecode) || !errors.As(err, &de) {
				t.Fatalf("err = %v, want a Permanent *DecodeError", err)
			}
			if de.ContentType != tt.contentType || de.Type != "typed_test.order" {
				t.Errorf("DecodeError %+v, want content type %q and type typed_test.order", de, tt.contentType)
			}
			if got := errors.Is(err, typed.ErrContentType); got != tt.wantType {
				t.Errorf("errors.Is(err, ErrContentType) = %v, want %v", got, tt.wantType)
			}
			if msg := chainrun.HandlerError(err).Error(); msg != tt.wantMessage {
				t.Errorf("message\n%s\nwant\n%s", msg, tt.wantMessage)
			}
		})
	}
	// The decoder's own error type is there for errors.As and the
	// error-type fault header.
	h, _ := capture()
	err := h(context.Background(), &amqp.Delivery{Body: []byte(`{x}`)})
	var syntax *json.SyntaxError
	if !errors.As(err, &syntax) || chainrun.ErrorType(err) != "*json.SyntaxError" {
		t.Errorf("err = %v (error type %s), want it to hold the *json.SyntaxError", err, chainrun.ErrorType(err))
	}
}

// The first decoder that takes a content type decodes it; one without
// content types takes them all; a message without one goes to the first.
func TestHandlerChoosesTheDecoder(t *testing.T) {
	var used []string
	named := func(name string, unmarshal func([]byte, any) error) func([]byte, any) error {
		return func(b []byte, v any) error {
			used = append(used, name)
			return unmarshal(b, v)
		}
	}
	h, got := capture(
		typed.WithDecoder(named("xml", xml.Unmarshal), "application/xml", "+xml"),
		typed.WithDecoder(named("json", json.Unmarshal), "application/json"),
		typed.WithDecoder(named("any", json.Unmarshal)),
	)
	for _, m := range []amqp.Delivery{
		{ContentType: "application/xml", Body: []byte(`<order><id>x</id><total>1</total></order>`)},
		{ContentType: "application/atom+xml", Body: []byte(`<order><id>a</id><total>2</total></order>`)},
		{ContentType: "application/json", Body: []byte(`{"id":"j","total":3}`)},
		{ContentType: "application/x-whatever", Body: []byte(`{"id":"w","total":4}`)},
		{Body: []byte(`<order><id>n</id><total>5</total></order>`)},
	} {
		if err := h(context.Background(), &m); err != nil {
			t.Fatalf("%q: %v", m.ContentType, err)
		}
	}
	want := []order{{"x", 1}, {"a", 2}, {"j", 3}, {"w", 4}, {"n", 5}}
	if len(*got) != len(want) {
		t.Fatalf("handled %+v, want %+v", *got, want)
	}
	for i := range want {
		if (*got)[i] != want[i] {
			t.Errorf("order %d = %+v, want %+v", i, (*got)[i], want[i])
		}
	}
	if wantUsed := "xml xml json any xml"; joined(used) != wantUsed {
		t.Errorf("decoders used: %s, want %s", joined(used), wantUsed)
	}
}

func joined(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}

// The function's own error comes back as it is: Retry retries it.
func TestHandlerReturnsTheFunctionsError(t *testing.T) {
	errDB := errors.New("database busy")
	h := typed.Handler(func(context.Context, order, *amqp.Delivery) error { return errDB })
	if err := h(context.Background(), &amqp.Delivery{Body: []byte(`{}`)}); err != errDB {
		t.Fatalf("err = %v, want the function's error unchanged", err)
	}
}

func TestHandlerInvalidArguments(t *testing.T) {
	defer func() {
		want := "typed: Handler expects a non-nil function\n" +
			"typed: WithDecoder expects a non-nil unmarshal function\n" +
			`typed: WithDecoder expects content types like application/xml or +xml, got "application/xml; charset=utf-8": no parameters or spaces` + "\n" +
			`typed: WithDecoder expects content types like application/xml or +xml, got "xml": type/subtype` + "\n" +
			`typed: WithDecoder expects content types like application/xml or +xml, got "+": a suffix is + and a name, without /` + "\n" +
			"typed: Handler expects non-nil options, got nil at index 1"
		if got := recover(); got != want {
			t.Fatalf("panic:\n%v\nwant:\n%s", got, want)
		}
	}()
	typed.Handler[order](nil, typed.WithDecoder(nil, "application/xml; charset=utf-8", "xml", "+"), nil)
}
