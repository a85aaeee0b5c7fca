package typed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
)

// Sentinels matched with errors.Is.
var (
	// ErrDecode: a message could not be decoded for a typed handler; its
	// *DecodeError says why.
	ErrDecode = errors.New("typed: message not decoded")

	// ErrContentType: a message's content type is none the handler takes.
	// See ContentTypeError.
	ErrContentType = errors.New("typed: content type not accepted")
)

// DecodeError reports a message that the handler could not decode: a body
// the decoder refused, or a content type it does not take. Handler returns it
// marked Permanent. It matches ErrDecode and unwraps to the decoder's error,
// or to a *ContentTypeError.
type DecodeError struct {
	ContentType string // the delivery's content type, as it came
	Type        string // the Go type the body was to be decoded into
	Err         error  // the decoder's error, or a *ContentTypeError
}

func (e *DecodeError) Error() string {
	if _, ok := e.Err.(*ContentTypeError); ok {
		return fmt.Sprintf("typed: cannot decode the body into %s: %v", e.Type, e.Err)
	}
	ct := "none"
	if e.ContentType != "" {
		ct = fmt.Sprintf("%q", e.ContentType)
	}
	return fmt.Sprintf("typed: cannot decode the body (content type %s) into %s: %v", ct, e.Type, e.Err)
}

func (e *DecodeError) Is(target error) bool { return target == ErrDecode }
func (e *DecodeError) Unwrap() error        { return e.Err }

// ContentTypeError reports a content type that none of the handler's
// decoders takes. It matches ErrContentType.
type ContentTypeError struct {
	ContentType string   // the delivery's content type, as it came ("" if none)
	Accepted    []string // the content types the handler takes
}

func (e *ContentTypeError) Error() string {
	if e.ContentType == "" {
		return fmt.Sprintf("the message has no content type, and this handler requires one of %s", strings.Join(e.Accepted, ", "))
	}
	return fmt.Sprintf("content type %q is none this handler takes (%s)", e.ContentType, strings.Join(e.Accepted, ", "))
}

func (e *ContentTypeError) Is(target error) bool { return target == ErrContentType }

// Handler returns a middleware.Handler that decodes each delivery's body into
// a T and calls handle with it; handle's error is returned as it is. A body
// that does not decode, or a content type no decoder takes, returns a
// Permanent *DecodeError without calling handle (see the package
// documentation for the content types taken). Each call decodes into a new
// T; the Handler is safe for concurrent use.
//
// It panics if handle is nil or an option is invalid, naming every problem.
func Handler[T any](handle func(ctx context.Context, msg T, d *amqp.Delivery) error, opts ...Option) middleware.Handler {
	c := config{}
	for i, opt := range opts {
		if opt == nil {
			c.errs = append(c.errs, fmt.Errorf("typed: Handler expects non-nil options, got nil at index %d", i))
			continue
		}
		opt(&c)
	}
	if handle == nil {
		c.errs = append([]error{errors.New("typed: Handler expects a non-nil function")}, c.errs...)
	}
	if len(c.errs) > 0 {
		panic(errors.Join(c.errs...).Error())
	}
	if len(c.decoders) == 0 {
		c.decoders = []decoder{jsonDecoder}
	}
	for _, dec := range c.decoders {
		c.accepted = append(c.accepted, dec.describe())
	}
	into := reflect.TypeFor[T]().String()
	return func(ctx context.Context, d *amqp.Delivery) error {
		unmarshal, err := c.decoderFor(d.ContentType)
		if err != nil {
			return middleware.Permanent(&DecodeError{ContentType: d.ContentType, Type: into, Err: err})
		}
		var msg T
		if err := decode(unmarshal, d.Body, &msg); err != nil {
			return middleware.Permanent(&DecodeError{ContentType: d.ContentType, Type: into, Err: err})
		}
		return handle(ctx, msg, d)
	}
}

// decode calls unmarshal, turning a panic of the decoder's into an error:
// bad input must not crash the consumer, and a decoder that panics on a
// body will panic on it again.
func decode(unmarshal func([]byte, any) error, body []byte, v any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the decoder panicked: %v", p)
		}
	}()
	return unmarshal(body, v)
}

// Option configures Handler.
type Option func(*config)

type config struct {
	decoders    []decoder
	requireType bool
	accepted    []string // for ContentTypeError, built once
	errs        []error
}

// decoder is one WithDecoder: an unmarshal function and the content types
// it takes (none: every content type).
type decoder struct {
	unmarshal func([]byte, any) error
	types     []string // lower case, "type/subtype" or "+suffix"
}

var jsonDecoder = decoder{unmarshal: json.Unmarshal, types: []string{"application/json", "+json"}}

func (d decoder) describe() string {
	if len(d.types) == 0 {
		return "any content type"
	}
	return strings.Join(d.types, ", ")
}

// WithDecoder decodes the messages whose content type is one of
// contentTypes with unmarshal, such as xml.Unmarshal or json.Unmarshal with
// options of yours. A content type is "type/subtype" (application/xml) or a
// structured syntax suffix, "+xml", which takes every type/subtype+xml;
// parameters and case are ignored. With no contentTypes the decoder takes
// every content type. Decoders given replace the default JSON one, and the
// first that takes a message's content type decodes it; a message without a
// content type goes to the first (unless RequireContentType).
func WithDecoder(unmarshal func(data []byte, v any) error, contentTypes ...string) Option {
	return func(c *config) {
		if unmarshal == nil {
			c.errs = append(c.errs, errors.New("typed: WithDecoder expects a non-nil unmarshal function"))
		}
		dec := decoder{unmarshal: unmarshal}
		for _, ct := range contentTypes {
			if problem := checkPattern(ct); problem != "" {
				c.errs = append(c.errs, fmt.Errorf("typed: WithDecoder expects content types like application/xml or +xml, got %q: %s", ct, problem))
				continue
			}
			dec.types = append(dec.types, strings.ToLower(ct))
		}
		c.decoders = append(c.decoders, dec)
	}
}

// RequireContentType refuses messages without a content type, with a
// Permanent *DecodeError (ErrContentType), instead of decoding them with the
// first decoder.
func RequireContentType() Option {
	return func(c *config) { c.requireType = true }
}

// checkPattern says what is wrong with a content type pattern, or "".
func checkPattern(p string) string {
	switch {
	case p == "":
		return "empty"
	case strings.ContainsAny(p, "; \t"):
		return "no parameters or spaces"
	case strings.HasPrefix(p, "+"):
		if len(p) == 1 || strings.Contains(p, "/") {
			return "a suffix is + and a name, without /"
		}
	default:
		i := strings.IndexByte(p, '/')
		if i <= 0 || i == len(p)-1 || strings.Count(p, "/") != 1 {
			return "type/subtype"
		}
	}
	return ""
}

// decoderFor returns the unmarshal function of the first decoder that takes
// contentType, or a *ContentTypeError.
func (c *config) decoderFor(contentType string) (func([]byte, any) error, error) {
	media := mediaType(contentType)
	if media == "" {
		if c.requireType {
			return nil, &ContentTypeError{ContentType: contentType, Accepted: c.accepted}
		}
		return c.decoders[0].unmarshal, nil
	}
	for _, dec := range c.decoders {
		if dec.takes(media) {
			return dec.unmarshal, nil
		}
	}
	return nil, &ContentTypeError{ContentType: contentType, Accepted: c.accepted}
}

// takes reports whether the decoder takes media, a lower-case type/subtype.
func (d decoder) takes(media string) bool {
	if len(d.types) == 0 {
		return true
	}
	for _, t := range d.types {
		if t[0] != '+' {
			if media == t {
				return true
			}
			continue
		}
		slash := strings.IndexByte(media, '/')
		if slash > 0 && len(media)-len(t) > slash+1 && strings.HasSuffix(media, t) {
			return true
		}
	}
	return false
}

// mediaType is the type/subtype of a content type, without its parameters
// and surrounding space, in lower case; "" when there is none.
func mediaType(contentType string) string {
	if i := strings.IndexByte(contentType, ';'); i >= 0 {
		contentType = contentType[:i]
	}
	contentType = strings.TrimSpace(contentType)
	for i := 0; i < len(contentType); i++ {
		if c := contentType[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(contentType)
		}
	}
	return contentType
}
