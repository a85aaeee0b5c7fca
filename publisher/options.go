package publisher

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/telemetry"
)

// Option configures New. An invalid value makes New fail with an error that
// names the option and the value.
type Option func(*config)

type config struct {
	confirmTimeout time.Duration
	channels       int
	logger         *slog.Logger
	conn           amqpconn.Config // New sets URLs
	closeTimeout   time.Duration
	maxInFlight    int
	mandatory      bool
	impersonate    bool
	telemetry      telemetry.Config
	errs           []error
}

// fail records an invalid option; New reports every one.
func (cfg *config) fail(format string, args ...any) {
	cfg.errs = append(cfg.errs, fmt.Errorf("publisher: "+format, args...))
}

func defaultConfig() config {
	return config{
		confirmTimeout: 30 * time.Second,
		channels:       4,
		conn: amqpconn.Config{
			Heartbeat:   10 * time.Second,
			DialTimeout: 10 * time.Second,
			Name:        "amqpretry publisher",
		},
		closeTimeout: 5 * time.Second,
		maxInFlight:  1024,
		mandatory:    true,
	}
}

// WithTLS sets the TLS configuration for amqps:// URLs. Without it amqps://
// verifies the broker against the system's roots and the URL's host name.
// The config is cloned at each dial, so one may be shared. New refuses it
// with an amqp:// URL, which never uses TLS: a silent fall back to plaintext.
func WithTLS(c *tls.Config) Option {
	return func(cfg *config) { cfg.conn.TLS = c }
}

// WithConfirmTimeout bounds the wait for a confirm once a message is sent; a
// Publish that passes it returns ErrNotConfirmed. Default 30s; the context's
// deadline applies too.
func WithConfirmTimeout(d time.Duration) Option {
	return func(cfg *config) {
		if d <= 0 {
			cfg.fail("WithConfirmTimeout expects a duration > 0, got %v", d)
		}
		cfg.confirmTimeout = d
	}
}

// WithChannels sets how many confirm channels concurrent publishes are spread
// over. Default 4: the broker runs each channel in one process, so a few
// channels use its cores while each still pipelines many confirms.
func WithChannels(n int) Option {
	return func(cfg *config) {
		if n < 1 || n > 256 {
			cfg.fail("WithChannels expects 1 to 256 channels, got %d", n)
		}
		cfg.channels = n
	}
}

// WithLogger sets where connection losses and redials are logged. Default
// slog.Default(). URLs are logged with their password hidden.
func WithLogger(l *slog.Logger) Option {
	return func(cfg *config) {
		if l == nil {
			cfg.fail("WithLogger expects a non-nil logger")
		}
		cfg.logger = l
	}
}

// WithHeartbeat sets the AMQP heartbeat interval: a broker that stops
// answering is noticed after about two intervals. Default 10s.
func WithHeartbeat(d time.Duration) Option {
	return func(cfg *config) {
		if d < time.Second {
			cfg.fail("WithHeartbeat expects at least 1s, got %v", d)
		}
		cfg.conn.Heartbeat = d
	}
}

// WithDialTimeout bounds each dial: the TCP connect and the TLS and AMQP
// handshakes of one address. A broker that accepts the connection and then
// says nothing (a frozen node) costs that long per try, New's first dial
// included. Default 10s.
func WithDialTimeout(d time.Duration) Option {
	return func(cfg *config) {
		if d < 100*time.Millisecond {
			cfg.fail("WithDialTimeout expects at least 100ms, got %v", d)
		}
		cfg.conn.DialTimeout = d
	}
}

// WithURLs adds the other nodes of url's cluster (url may be among them):
// each dial tries them all in a random order, so that the publishers of a
// fleet spread over the nodes, and after losing a connection the publisher
// dials the other nodes at once, the lost one last. Every address must log
// in as the same user, and New refuses them otherwise: a recoverer compares
// a message's user-id with Username to keep RabbitMQ from refusing the copy.
// WithURLsInOrder keeps the order given, url first.
func WithURLs(urls ...string) Option {
	return func(cfg *config) { cfg.conn.URLs = append(cfg.conn.URLs, urls...) }
}

// WithURLsInOrder makes each dial try url, then the URLs of WithURLs in the
// order given, instead of a random order.
func WithURLsInOrder() Option { return func(cfg *config) { cfg.conn.InOrder = true } }

// WithConnectionName sets the name the broker shows for the connection
// (rabbitmqctl list_connections client_properties). Default
// "amqpretry publisher".
func WithConnectionName(name string) Option {
	return func(cfg *config) { cfg.conn.Name = name }
}

// WithCloseTimeout bounds how long Close waits for publishes in flight to be
// confirmed before it closes the connection. Default 5s.
func WithCloseTimeout(d time.Duration) Option {
	return func(cfg *config) {
		if d < 0 {
			cfg.fail("WithCloseTimeout expects a duration >= 0, got %v", d)
		}
		cfg.closeTimeout = d
	}
}

// WithImpersonation says that the user the Publisher logs in as has
// RabbitMQ's impersonator tag, so a message may carry any user-id. Without
// it, Publish refuses (ErrInvalidMessage, before sending) a user-id other
// than the login: the broker would close the channel on it, and with it
// every unconfirmed publish sharing that channel.
func WithImpersonation() Option { return func(cfg *config) { cfg.impersonate = true } }

// WithMandatory sets whether Publish sets mandatory: with it (the default)
// a message no queue takes comes back and Publish returns ErrUnroutable;
// without it the broker drops such a message and Publish returns nil once
// it confirms, as Spring's RabbitTemplate and Watermill do by default: for
// events that may have no subscriber yet. WithMandatoryContext decides per
// call; recoverers and the outbox relay always ask for mandatory.
func WithMandatory(mandatory bool) Option { return func(cfg *config) { cfg.mandatory = mandatory } }

// WithMaxInFlight bounds how many async publishes (PublishAsync) may await
// their outcome at once: past it, PublishAsync waits for one to finish (its
// done to return), until its context ends, rather than buffer without
// limit. Publish is not counted: each caller waits for its own. Default
// 1024, enough to keep a few channels' confirms pipelined across a network
// round trip.
func WithMaxInFlight(n int) Option {
	return func(cfg *config) {
		if n < 1 {
			cfg.fail("WithMaxInFlight expects at least 1, got %d", n)
		}
		cfg.maxInFlight = n
	}
}
