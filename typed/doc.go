// Package typed lets a handler take the message decoded: typed.Handler(handleOrder),
// with handleOrder a func(ctx, Order, *amqp.Delivery) error, is a
// middleware.Handler that decodes each body from JSON into an Order and
// calls handleOrder with it.
//
// A body that does not decode, or whose content type the handler does not
// take, fails with a Permanent *DecodeError that carries the decoder's
// error: Retry does not retry it (a malformed message will not parse on the
// fifth attempt either), Recover hands it to its recoverer after the first
// attempt, and the dead letter's x-exception-message says what did not
// decode. It is Spring AMQP's MessageConverter with a
// ListenerExecutionFailedException that is never retried, and MassTransit's
// deserialization fault.
//
//	l, err := listener.New("orders",
//		middleware.Chain(middleware.Retry(5), middleware.Recover(dlq)),
//		typed.Handler(handleOrder),
//		listener.WithURL(url))
//
// # Content types
//
// By default the handler decodes with encoding/json and takes
// application/json, any type with the +json suffix (application/vnd.acme.order+json),
// and messages without a content type, which many producers do not set.
// Parameters (charset=utf-8) and case are ignored. RequireContentType
// refuses messages without one; WithDecoder replaces JSON with decoders of
// your own, each for its content types, the first that takes a message's
// content type decoding it:
//
//	typed.Handler(handleOrder,
//		typed.WithDecoder(json.Unmarshal, "application/json", "+json"),
//		typed.WithDecoder(xml.Unmarshal, "application/xml", "text/xml"))
//
// A decoder is an unmarshal function, func(data []byte, v any) error, as
// encoding/json, encoding/xml and most codecs provide; the package adds no
// dependency.
//
// # Invalid arguments
//
// Handler panics on arguments that are wrong whatever the message (a nil
// function, a nil decoder, a malformed content type pattern), naming each
// with its value.
package typed
