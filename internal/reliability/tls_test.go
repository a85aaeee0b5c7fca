package reliability

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/publisher"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// serverCert issues a certificate for the given host names and IPs.
func (ca *testCA) serverCert(t *testing.T, hosts ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// tlsBroker puts a TLS-terminating proxy with cert in front of the broker
// and returns its amqps:// URL for host.
func tlsBroker(t *testing.T, cert tls.Certificate, host string) string {
	t.Helper()
	brokertest.Dial(t)
	p, err := faultproxy.StartTLS(brokertest.Addr(), &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	_, port, _ := net.SplitHostPort(p.Addr())
	u, err := url.Parse(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme, u.Host = "amqps", net.JoinHostPort(host, port)
	return u.String()
}

func TestAMQPSWithTheRightCA(t *testing.T) {
	ca := newCA(t, "amqpretry test CA")
	url := tlsBroker(t, ca.serverCert(t, "localhost", "127.0.0.1"), "localhost")
	trusting := &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}

	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	pub, err := publisher.New(url, publisher.WithTLS(trusting))
	if err != nil {
		t.Fatalf("publisher over amqps: %v", err)
	}
	defer pub.Close()
	if err := pub.Publish(ctxTimeout(t, 5*time.Second), "", q, amqp.Publishing{MessageId: "over-tls"}); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	l, err := listener.New(q, nil, func(_ context.Context, d *amqp.Delivery) error { got <- d.MessageId; return nil },
		listener.WithURL(url), listener.WithTLS(trusting), listener.WithLogger(newLogBook().logger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	select {
	case id := <-got:
		if id != "over-tls" {
			t.Errorf("got %q", id)
		}
	case <-time.After(10 * time.Second):
		t.Error("the listener received nothing over amqps")
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
}

// Peer verification is on by default and cannot be fooled by a wrong CA or a
// certificate for another host.
func TestAMQPSRefusesWhatItCannotVerify(t *testing.T) {
	ca := newCA(t, "amqpretry test CA")
	other := newCA(t, "someone else's CA")
	tests := []struct {
		name   string
		cert   tls.Certificate
		host   string
		config *tls.Config
		want   string
	}{
		{"system roots by default", ca.serverCert(t, "localhost"), "localhost", nil, "certificate signed by unknown authority"},
		{"a different CA", ca.serverCert(t, "localhost"), "localhost", &tls.Config{RootCAs: other.pool}, "certificate signed by unknown authority"},
		{"a certificate for another host", ca.serverCert(t, "broker.example.com"), "localhost", &tls.Config{RootCAs: ca.pool}, "certificate is valid for broker.example.com, not localhost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := tlsBroker(t, tt.cert, tt.host)
			opts := []publisher.Option{}
			if tt.config != nil {
				opts = append(opts, publisher.WithTLS(tt.config))
			}
			pub, err := publisher.New(url, opts...)
			if err == nil {
				pub.Close()
				t.Fatal("the dial succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
			// The listener refuses the same way, and gives up at once:
			// redialing cannot make the certificate verify.
			book := newLogBook()
			lopts := []listener.Option{listener.WithURL(url), listener.WithLogger(book.logger())}
			if tt.config != nil {
				lopts = append(lopts, listener.WithTLS(tt.config))
			}
			l, _ := listener.New("q", nil, func(context.Context, *amqp.Delivery) error { return nil }, lopts...)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			begin := time.Now()
			err = l.Run(ctx)
			if ctx.Err() != nil || err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "WithTLS") {
				t.Errorf("the listener's Run = %v after %v, want it to end at once with %q and name WithTLS; its log:\n%s", err, time.Since(begin), tt.want, book.all())
			}
		})
	}
}
