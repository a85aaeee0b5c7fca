package amqpconn_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// brokerAddr is the host:port of the broker under test, where proxies forward.
func brokerAddr(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(brokertest.URL())
	if err != nil {
		t.Fatalf("$AMQP_URL %s: %v", amqpurl.Redact(brokertest.URL()), err)
	}
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "amqps" {
		return net.JoinHostPort(u.Hostname(), "5671")
	}
	return net.JoinHostPort(u.Hostname(), "5672")
}

// withHost is rawURL, credentials and vhost kept, at another host:port.
func withHost(t *testing.T, rawURL, hostPort string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hostPort
	return u.String()
}

// deadURL is the broker's URL at a loopback port nobody listens on.
func deadURL(t *testing.T, from string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return withHost(t, from, addr)
}

func startProxy(t *testing.T) (*faultproxy.Proxy, string) {
	t.Helper()
	brokertest.Dial(t)
	proxy, err := faultproxy.Start(brokerAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	return proxy, withHost(t, brokertest.URL(), proxy.Addr())
}

func TestDialTriesTheURLsInOrder(t *testing.T) {
	brokertest.Dial(t)
	live := brokertest.URL()
	dead := deadURL(t, live)
	tests := []struct {
		name string
		urls []string
		want string // reached
	}{
		{"one", []string{live}, live},
		{"the first is dead", []string{dead, live}, live},
		{"the first answers", []string{live, dead}, live},
		{"two dead, then one", []string{dead, deadURL(t, live), live}, live},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := amqpconn.Dial(context.Background(), amqpconn.Config{URLs: tt.urls, InOrder: true, DialTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if conn.RedactedURL != amqpurl.Redact(tt.want) {
				t.Errorf("RedactedURL = %q, want %q", conn.RedactedURL, amqpurl.Redact(tt.want))
			}
		})
	}
}

// A Dialer tries the address it reached last, last: after a lost
// connection the other nodes come first, and two addresses alternate.
func TestDialerMovesOnFromTheAddressItReached(t *testing.T) {
	_, a := startProxy(t)
	_, b := startProxy(t)
	for _, inOrder := range []bool{true, false} {
		d := amqpconn.NewDialer(amqpconn.Config{URLs: []string{a, b}, InOrder: inOrder, DialTimeout: 5 * time.Second})
		var reached []string
		for range 4 {
			conn, err := d.Dial(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			reached = append(reached, conn.RedactedURL)
			_ = conn.Close()
		}
		if reached[0] == reached[1] || reached[1] == reached[2] || reached[2] == reached[3] {
			t.Errorf("InOrder %v: reached %v, want each dial on the other address", inOrder, reached)
		}
		if inOrder && reached[0] != amqpurl.Redact(a) {
			t.Errorf("InOrder: the first dial reached %s, want the first URL", reached[0])
		}
	}
	if !amqpconn.NewDialer(amqpconn.Config{URLs: []string{a, b}}).Several() || amqpconn.NewDialer(amqpconn.Config{URLs: []string{a}}).Several() {
		t.Error("Several is wrong")
	}
}

func TestDialNamesEveryFailedURLButNoPassword(t *testing.T) {
	const password = "hunter2-do-not-log"
	base := "amqp://someone:" + password + "@127.0.0.1/"
	urls := []string{deadURL(t, base), deadURL(t, base), "amqp://someone:" + password + "@127.0.0.1:notaport/"}
	_, err := amqpconn.Dial(context.Background(), amqpconn.Config{URLs: urls, DialTimeout: 5 * time.Second})
	var failed *amqpconn.DialError
	if !errors.As(err, &failed) || len(failed.Errs) != len(urls) {
		t.Fatalf("Dial = %v, want a *DialError with %d causes", err, len(urls))
	}
	for _, u := range urls {
		if !strings.Contains(err.Error(), amqpurl.Redact(u)+": ") {
			t.Errorf("the error does not name %s: %v", amqpurl.Redact(u), err)
		}
	}
	if strings.Contains(err.Error(), password) {
		t.Errorf("the error leaks the password: %v", err)
	}
	if _, refusal := amqpconn.LoginRefused(err); refusal != nil {
		t.Errorf("LoginRefused = %v, want nil: nobody answered", refusal)
	}
	if _, err := amqpconn.Dial(context.Background(), amqpconn.Config{}); !errors.As(err, &failed) {
		t.Errorf("Dial without URLs = %v, want a *DialError", err)
	}
}

func TestLoginRefusedNamesTheURL(t *testing.T) {
	brokertest.Dial(t)
	wrong := brokertest.WithCredentials("guest", "wrong-hunter2")
	_, err := amqpconn.Dial(context.Background(), amqpconn.Config{URLs: []string{deadURL(t, wrong), wrong}, DialTimeout: 5 * time.Second})
	url, refusal := amqpconn.LoginRefused(err)
	if refusal == nil || refusal.Code != amqp.AccessRefused || url != amqpurl.Redact(wrong) {
		t.Fatalf("LoginRefused(%v) = %q, %v; want the second URL, refused", err, url, refusal)
	}
}

// The broker's answers to connection.open, as RabbitMQ 3.10 to 4.3 word
// them: the permission and virtual host refusals are refused logins, the
// connection limits (530 as well) are not.
func TestLoginRefusedTellsTheConnectionLimits(t *testing.T) {
	for _, tt := range []struct {
		code    int
		reason  string
		refused bool
	}{
		{amqp.AccessRefused, "username or password not allowed", true},
		{amqp.NotAllowed, "NOT_ALLOWED - access to vhost 'v' refused for user 'u'", true},
		{amqp.NotAllowed, "NOT_ALLOWED - vhost v not found", true},
		{amqp.NotAllowed, "NOT_ALLOWED - access to vhost 'v' refused for user 'u': connection limit (0) is reached", false},
		{amqp.NotAllowed, "NOT_ALLOWED - Connection refused for user 'u': user connection limit (3) is reached", false},
		{amqp.NotAllowed, "NOT_ALLOWED - something new", false},
		{amqp.InternalError, "INTERNAL_ERROR - access to vhost 'v' refused for user 'u': vhost 'v' is down", false},
	} {
		err := &amqpconn.DialError{URLs: []string{"amqp://u:xxxxx@h/v"}, Errs: []error{&amqp.Error{Code: tt.code, Reason: tt.reason, Server: true}}}
		if _, refusal := amqpconn.LoginRefused(err); (refusal != nil) != tt.refused {
			t.Errorf("LoginRefused(%d %s) = %v, want refused %v", tt.code, tt.reason, refusal, tt.refused)
		}
	}
}

// What the Config says reaches amqp091 (its Config holds what was negotiated).
func TestDialSettings(t *testing.T) {
	brokertest.Dial(t)
	conn, err := amqpconn.Dial(context.Background(), amqpconn.Config{
		URLs: []string{brokertest.URL()}, Heartbeat: 3 * time.Second, DialTimeout: 5 * time.Second, Name: "amqpconn test",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := conn.Config.Heartbeat; got != 3*time.Second {
		t.Errorf("heartbeat = %v, want 3s", got)
	}
	if got := conn.Config.Locale; got != "en_US" {
		t.Errorf("locale = %q, want en_US", got)
	}
	if got := conn.Config.Properties["connection_name"]; got != "amqpconn test" {
		t.Errorf("connection_name = %v, want %q", got, "amqpconn test")
	}
}

// amqp091 writes the URL's host into the TLS config it is given: a config
// shared by connections to different hosts would be raced on and pinned to
// the first host's name. Dial hands it a copy.
func TestDialLeavesTheCallersTLSConfigAlone(t *testing.T) {
	brokertest.Dial(t)
	// httptest's certificate is valid for 127.0.0.1: borrow it.
	https := httptest.NewUnstartedServer(nil)
	https.StartTLS()
	cert, pool := https.TLS.Certificates[0], x509.NewCertPool()
	pool.AddCert(https.Certificate())
	https.Close()
	proxy, err := faultproxy.StartTLS(brokerAddr(t), &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	u, _ := url.Parse(withHost(t, brokertest.URL(), proxy.Addr()))
	u.Scheme = "amqps"
	shared := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	conn, err := amqpconn.Dial(context.Background(), amqpconn.Config{URLs: []string{u.String()}, TLS: shared, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	if shared.ServerName != "" {
		t.Errorf("after a dial the caller's TLS config has ServerName %q, want it untouched", shared.ServerName)
	}
}

// A publish stuck in a socket write, then a heartbeat timeout: without
// Abandon, amqp091's shutdown and the write wait for each other forever.
func TestAbandonFreesAStuckWrite(t *testing.T) {
	proxy, url := startProxy(t)
	conn, err := amqpconn.Dial(context.Background(), amqpconn.Config{URLs: []string{url}, Heartbeat: time.Second, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole(true)
	defer proxy.Blackhole(false)
	stuck := make(chan error, 1)
	go func() {
		stuck <- ch.Publish("", "nowhere", false, false, amqp.Publishing{Body: make([]byte, 8<<20)})
	}()
	select {
	case <-stuck:
		t.Fatal("the write did not block: the test proves nothing")
	case <-time.After(4 * time.Second): // past the heartbeat timeout
	}
	conn.Abandon()
	select {
	case err := <-stuck:
		if err == nil {
			t.Fatal("the write succeeded on an abandoned socket")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Abandon did not free the stuck write")
	}
	if !conn.IsClosed() {
		t.Error("the connection is not closed after Abandon")
	}
}

// A context that ends mid-handshake ends Dial at once, and the addresses
// after the one being dialed are not tried.
func TestDialGivesUpWhenCancelled(t *testing.T) {
	proxy, url := startProxy(t)
	proxy.Blackhole(true) // TCP connects, the handshake never answers
	defer proxy.Blackhole(false)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	begin := time.Now()
	conn, err := amqpconn.Dial(ctx, amqpconn.Config{URLs: []string{url, brokertest.URL()}, InOrder: true, DialTimeout: 10 * time.Second})
	if conn != nil {
		_ = conn.Close()
		t.Fatal("Dial went on to the next address after its context ended")
	}
	var failed *amqpconn.DialError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &failed) || len(failed.Errs) != 1 || time.Since(begin) > 2*time.Second {
		t.Fatalf("Dial = %v after %v, want the context's error at once, for the first address only", err, time.Since(begin))
	}
}

func TestRedialerBounds(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		pause    int // 1 = the first after Reset
		min, max time.Duration
	}{
		{1, 50 * ms, 150 * ms},                  // 100ms ±50%
		{2, 75 * ms, 225 * ms},                  // 150ms
		{3, 112 * ms, 338 * ms},                 // 225ms
		{12, 4325 * ms, 12975 * ms},             // 8.65s
		{13, 5 * time.Second, 15 * time.Second}, // 12.97s capped at 10s, ±50%
		{200, 5 * time.Second, 15 * time.Second},
	}
	for _, tt := range tests {
		r := amqpconn.NewRedialer()
		for range 200 { // the pauses are random: look at many
			var d time.Duration
			for range tt.pause {
				d = r.Next()
			}
			if d < tt.min || d > tt.max {
				t.Fatalf("pause %d = %v, want %v to %v", tt.pause, d, tt.min, tt.max)
			}
			r.Reset()
		}
	}
}

func TestSleepEndsWithTheContext(t *testing.T) {
	if err := amqpconn.Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep = %v, want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	begin := time.Now()
	if err := amqpconn.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) || time.Since(begin) > 5*time.Second {
		t.Errorf("Sleep = %v after %v, want context.Canceled at once", err, time.Since(begin))
	}
}
