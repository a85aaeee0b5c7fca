package amqpconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpurl"
)

// Config is how to reach the broker. Dial neither changes it nor keeps it, so
// one Config may serve many dials at once.
type Config struct {
	// URLs are the broker's addresses, amqp:// or amqps://: one broker, or
	// the nodes of a cluster. Each dial tries them in a random order (Spring
	// AMQP's AddressShuffleMode.RANDOM), so that clients spread over the
	// nodes, unless InOrder.
	URLs []string
	// InOrder tries URLs in the order given: the first is preferred and the
	// others are fallbacks.
	InOrder bool
	// TLS is for amqps://; nil verifies the broker against the system's
	// roots and the URL's host name.
	TLS *tls.Config
	// Heartbeat: amqp091 gives up on a connection after 1.5 silent
	// intervals. Zero is amqp091's default, 10s.
	Heartbeat time.Duration
	// DialTimeout bounds the TCP connect and the TLS and AMQP handshakes of
	// each address. Zero is amqp091's default, 30s.
	DialTimeout time.Duration
	// Name is the connection name the broker shows; "" sends none.
	Name string
	// Guard, when set, wraps the connection's stream under amqp091-go
	// (framecheck.Guard): the socket, or for amqps:// the TLS connection
	// above it, which Dial then makes itself.
	Guard func(net.Conn) net.Conn
}

// Redacted is the addresses with their passwords hidden, for logs and errors.
func (c Config) Redacted() string {
	redacted := make([]string, len(c.URLs))
	for i, url := range c.URLs {
		redacted[i] = amqpurl.Redact(url)
	}
	return strings.Join(redacted, ", ")
}

// PlaintextDespiteTLS returns, redacted, the addresses that are amqp://
// although c has a TLS config: amqp091 uses the config only for amqps://, so
// a caller who gave one and an amqp:// URL would talk in plaintext while
// believing otherwise. The listener and the publisher refuse them.
func (c Config) PlaintextDespiteTLS() []string {
	if c.TLS == nil {
		return nil
	}
	var plain []string
	for _, url := range c.URLs {
		if uri, err := amqpurl.Parse(url); err == nil && uri.Scheme != "amqps" {
			plain = append(plain, amqpurl.Redact(url))
		}
	}
	return plain
}

// Conn is an AMQP connection and its socket.
type Conn struct {
	*amqp.Connection
	RedactedURL string // the address Dial reached, password hidden: for logs
	url         string

	mu  sync.Mutex
	raw net.Conn
}

// Dial connects to the first of cfg.URLs that answers, in the order
// cfg says. It gives up on an address after cfg.DialTimeout and on all of
// them as soon as ctx ends, handshakes included. Its error is a *DialError.
func Dial(ctx context.Context, cfg Config) (*Conn, error) {
	return dialAny(ctx, cfg, cfg.order(""))
}

// Dialer dials a Config again and again, for an owner that redials: it
// remembers the address it reached last and tries that one last next time,
// so that after a lost connection the other nodes of a cluster come first
// rather than the one that just died. Not safe for concurrent use.
type Dialer struct {
	cfg  Config
	last string
}

// NewDialer returns a Dialer for cfg.
func NewDialer(cfg Config) *Dialer { return &Dialer{cfg: cfg} }

// Dial is Dial(ctx, cfg), with the address reached last tried last.
func (d *Dialer) Dial(ctx context.Context) (*Conn, error) {
	conn, err := dialAny(ctx, d.cfg, d.cfg.order(d.last))
	if err == nil {
		d.last = conn.url
	}
	return conn, err
}

// Several reports whether there is more than one address: only then is
// there somewhere else to go at once after a loss.
func (d *Dialer) Several() bool { return len(d.cfg.URLs) > 1 }

// order is the order of one dial: URLs shuffled unless InOrder, with last
// (the address reached before, if any) moved to the end.
func (c Config) order(last string) []string {
	urls := slices.Clone(c.URLs)
	if !c.InOrder {
		rand.Shuffle(len(urls), func(i, j int) { urls[i], urls[j] = urls[j], urls[i] })
	}
	if i := slices.Index(urls, last); i >= 0 && len(urls) > 1 {
		urls = append(slices.Delete(urls, i, i+1), last)
	}
	return urls
}

func dialAny(ctx context.Context, cfg Config, urls []string) (*Conn, error) {
	if len(urls) == 0 {
		return nil, &DialError{URLs: []string{"(no URL)"}, Errs: []error{errors.New("amqpconn: Config.URLs is empty")}}
	}
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	failed := &DialError{}
	for _, url := range urls {
		redacted := amqpurl.Redact(url)
		// amqp091's own parse errors may quote the password.
		_, err := amqpurl.Parse(url)
		if err == nil {
			var conn *Conn
			if conn, err = dial(ctx, url, cfg.amqpConfig(), timeout, cfg.Guard); err == nil {
				conn.RedactedURL, conn.url = redacted, url
				return conn, nil
			}
		}
		failed.URLs = append(failed.URLs, redacted)
		failed.Errs = append(failed.Errs, err)
		if ctx.Err() != nil {
			break // the other addresses would fail the same way
		}
	}
	return nil, failed
}

// amqpConfig is fresh for each dial: amqp091 writes into the properties
// table and, for amqps://, into the TLS config (ServerName), which would
// race, and pin one host's name, on a config shared by connections to
// different hosts.
func (c Config) amqpConfig() amqp.Config {
	props := amqp.NewConnectionProperties()
	if c.Name != "" {
		props.SetClientConnectionName(c.Name)
	}
	return amqp.Config{
		Heartbeat:       c.Heartbeat,
		TLSClientConfig: c.TLS.Clone(),
		Locale:          "en_US",
		Properties:      props,
	}
}

// DialError is why Dial reached none of its addresses: Errs[i] is why
// URLs[i] failed, in the order tried. Its text names each address with the
// password hidden: "amqp://u:xxxxx@a:5672/: dial tcp ...; amqp://...".
type DialError struct {
	URLs []string // redacted
	Errs []error
}

func (e *DialError) Error() string {
	parts := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		parts[i] = e.URLs[i] + ": " + err.Error()
	}
	return strings.Join(parts, "; ")
}

func (e *DialError) Unwrap() []error { return e.Errs }

// LoginRefused returns the address whose broker refused the login in an
// error from Dial, and the broker's answer; refusal is nil if none did.
// Redialing with the same credentials cannot fix a refused login: a wrong
// user name or password (403), a user without permission on the virtual
// host or a virtual host that does not exist (530). A connection limit
// reached is a 530 too, but not a refused login: it heals when
// connections close.
func LoginRefused(err error) (url string, refusal *amqp.Error) {
	var failed *DialError
	if !errors.As(err, &failed) {
		return "", nil
	}
	for i, cause := range failed.Errs {
		var aerr *amqp.Error
		if errors.As(cause, &aerr) && loginRefusal(aerr) {
			return failed.URLs[i], aerr
		}
	}
	return "", nil
}

// loginRefusal tells the broker's answers to a login that only a change of
// credentials, permissions or virtual hosts can heal. RabbitMQ answers
// connection.open with 530 NOT_ALLOWED and "access to vhost 'v' refused for
// user 'u'" (no permission), "vhost v not found", or, to be retried, "...:
// connection limit (n) is reached" or "...: user connection limit (n) is
// reached". An unknown 530 is retried.
func loginRefusal(aerr *amqp.Error) bool {
	switch {
	case aerr.Code == amqp.AccessRefused:
		return true
	case aerr.Code != amqp.NotAllowed, strings.Contains(aerr.Reason, "limit"):
		return false
	}
	return strings.HasSuffix(aerr.Reason, "not found") && strings.Contains(aerr.Reason, "vhost") ||
		strings.Contains(aerr.Reason, "access to vhost") && strings.Contains(aerr.Reason, "refused for user")
}

// LoginFix says what to change after the broker at url (as LoginRefused
// returns it) refused a login with refusal.
func LoginFix(url string, refusal *amqp.Error) string {
	vhost, user := "<vhost>", "<user>"
	if uri, err := amqpurl.Parse(url); err == nil {
		vhost, user = uri.Vhost, uri.Username
	}
	switch {
	case refusal.Code == amqp.NotAllowed && strings.HasSuffix(refusal.Reason, "not found"):
		return fmt.Sprintf("the virtual host %q does not exist: create it (rabbitmqctl add_vhost %s) or correct the URL's path", vhost, vhost)
	case refusal.Code == amqp.NotAllowed:
		return fmt.Sprintf("the user %q has no permission on the virtual host %q: grant it "+
			"(rabbitmqctl set_permissions -p %s %s <configure> <write> <read>) or correct the URL", user, vhost, vhost, user)
	}
	return "check the user name and password in the URL; redialing with the same ones cannot succeed"
}

// TLSRefused returns the address whose certificate failed verification in
// an error from Dial, and why; cause is nil if none did. Redialing cannot
// make a certificate that is not trusted, or names another host, verify.
func TLSRefused(err error) (url string, cause error) {
	var failed *DialError
	if !errors.As(err, &failed) {
		return "", nil
	}
	for i, c := range failed.Errs {
		var (
			verification *tls.CertificateVerificationError
			unknown      x509.UnknownAuthorityError
			hostname     x509.HostnameError
			invalid      x509.CertificateInvalidError
		)
		if errors.As(c, &verification) || errors.As(c, &unknown) || errors.As(c, &hostname) || errors.As(c, &invalid) {
			return failed.URLs[i], c
		}
	}
	return "", nil
}

// dial connects like amqp.DialConfig, with dialTimeout for the TCP connect
// and the handshakes, and gives up as soon as ctx ends; config.Dial is
// replaced.
func dial(ctx context.Context, url string, config amqp.Config, dialTimeout time.Duration, guard func(net.Conn) net.Conn) (*Conn, error) {
	// amqp091 runs TLS above the socket Dial returns, where a guard would
	// see only ciphertext: for a guarded amqps:// connection the TLS is done
	// here, under the guard, and amqp091 is given the URL as amqp://.
	var guardedTLS *tls.Config
	tlsAddr := ""
	if guard != nil {
		uri, err := amqpurl.Parse(url)
		switch {
		case err != nil:
			guard = nil
		case uri.Scheme == "amqps":
			if guardedTLS, err = tlsConfig(uri, config.TLSClientConfig); err != nil {
				return nil, err
			}
			tlsAddr = net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
			url = "amqp" + url[len("amqps"):]
		}
	}
	c := &Conn{}
	config.Dial = func(network, addr string) (net.Conn, error) {
		if guardedTLS != nil {
			addr = tlsAddr // amqps's port, not amqp's default
		}
		d := net.Dialer{Timeout: dialTimeout}
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// As amqp091's DefaultDial: a deadline for the TLS and AMQP handshakes,
		// cleared once the connection is open.
		if err := raw.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
			_ = raw.Close()
			return nil, err
		}
		c.mu.Lock()
		c.raw = raw
		c.mu.Unlock()
		if guardedTLS != nil {
			tc := tls.Client(raw, guardedTLS)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = raw.Close()
				return nil, err
			}
			return guard(tc), nil
		}
		if guard != nil {
			return guard(raw), nil
		}
		return raw, nil
	}
	// A context that ends during the handshake closes the socket under it.
	abandoned := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(abandoned)
		c.Abandon()
	})
	conn, err := amqp.DialConfig(url, config)
	if !stop() {
		<-abandoned // the AfterFunc ran: wait for it, so no goroutine outlives the call
		if err == nil {
			_ = conn.Close()
			err = ctx.Err()
		}
	}
	if err != nil {
		c.Abandon() // a failed handshake may leave the socket open
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (while dialing: %v)", ctx.Err(), err)
		}
		return nil, err
	}
	c.Connection = conn
	return c, nil
}

// tlsConfig is the TLS config amqp091 would use for uri: given's (a copy),
// else one from the URL's cacertfile, certfile, keyfile and
// server_name_indication; the server name is the URL's host unless set.
func tlsConfig(uri amqp.URI, given *tls.Config) (*tls.Config, error) {
	cfg := given.Clone()
	if cfg == nil {
		cfg = &tls.Config{ServerName: uri.ServerName, MinVersion: tls.VersionTLS12}
		if uri.CACertFile != "" {
			pem, err := os.ReadFile(uri.CACertFile)
			if err != nil {
				return nil, fmt.Errorf("read CA certificate: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			cfg.RootCAs.AppendCertsFromPEM(pem)
		}
		if uri.CertFile != "" && uri.KeyFile != "" {
			cert, err := tls.LoadX509KeyPair(uri.CertFile, uri.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("load client certificate: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
	}
	if cfg.ServerName == "" {
		cfg.ServerName = uri.Host
	}
	return cfg, nil
}

// Abandon closes the socket under the connection at once, unblocking any
// write stuck in it; amqp091 then shuts the connection down. Safe to call
// more than once and after Close.
func (c *Conn) Abandon() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.raw != nil {
		_ = c.raw.Close()
	}
}
