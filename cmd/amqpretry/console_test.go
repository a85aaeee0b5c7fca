package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
)

var signInLine = regexp.MustCompile(`sign in \(token "operator"\): (http://127\.0\.0\.1:[0-9]+/)login\?token=([A-Za-z0-9_-]+)`)

// startConsole runs amqpretry console with args until the test ends, and
// returns the address it serves at and its printed token.
func startConsole(t *testing.T, args ...string) (base, token string, stderr *testlog.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &testlog.Buffer{}, &testlog.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"console", "--listen", "127.0.0.1:0", "--url", brokertest.URL()}, args...), stdout, stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("console exited %d: %s", code, stderr.String())
		}
	})
	brokertest.Eventually(t, 10*time.Second, "the console's sign-in address", func() bool {
		select {
		case code := <-done:
			done <- code
			t.Fatalf("console exited %d: %s%s", code, stdout.String(), stderr.String())
		default:
		}
		return signInLine.MatchString(stdout.String())
	})
	m := signInLine.FindStringSubmatch(stdout.String())
	return m[1], m[2], stderr
}

// browse signs in at the printed address and returns a client with the
// session's cookie.
func browse(t *testing.T, base, token string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	if code, body := fetch(t, c, base+"login?token="+token); code != http.StatusOK || !strings.Contains(body, "Signed in") {
		t.Fatalf("sign in: %d\n%s", code, body)
	}
	return c
}

func fetch(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var csrfInPage = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// submit posts form from the console's own origin, as its page would, with
// the CSRF token of the page at from.
func submit(t *testing.T, c *http.Client, base, from, path string, form url.Values) (int, string) {
	t.Helper()
	_, page := fetch(t, c, base+from)
	m := csrfInPage.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no form on %s:\n%s", from, page)
	}
	form.Set("csrf", m[1])
	req, _ := http.NewRequest(http.MethodPost, base+strings.TrimPrefix(path, "/"), strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", strings.TrimSuffix(base, "/"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// amqpretry console --queue DLQ serves the DLQ's dead letters grouped by
// cause, with the outbox's failed rows beside them (--dsn), and appends an
// audit line per action to --audit-log.
func TestConsoleCommand(t *testing.T) {
	topo := withDeadLetters(t, 6)
	db, _, table, ids := outboxWithRows(t, 3)
	fail(t, db, table, "NOT_FOUND - no exchange 'orders'\x1b[31m", ids[0], ids[1])
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	base, token, _ := startConsole(t, "--queue", topo.DLQ(), "--audit-log", audit, "--dsn", testDSN(), "--table", table)
	c := browse(t, base, token)

	_, body := fetch(t, c, base)
	for _, want := range []string{">3</td>", "customer not found", "tax service timed out", "6 of 6 messages"} {
		if !strings.Contains(body, want) {
			t.Errorf("the overview lacks %q:\n%s", want, body)
		}
	}
	_, body = fetch(t, c, base+"outbox")
	for _, want := range []string{`NOT_FOUND - no exchange &#39;orders&#39;\x1b[31m`, `id\x1b[2J\u202e`, "2 failed", fmt.Sprintf(`value="%d"`, ids[1])} {
		if !strings.Contains(body, want) {
			t.Errorf("the outbox page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "\x1b") || strings.Contains(body, "\u202e") {
		t.Errorf("the outbox page holds raw control characters")
	}
	code, body := submit(t, c, base, "outbox", "outbox/retry", url.Values{"id": {fmt.Sprint(ids[1])}})
	if code != http.StatusOK || !strings.Contains(body, "put 1 failed row(s) back in flight") {
		t.Fatalf("retry: %d\n%s", code, body)
	}
	if s := status(t, db, table, ids[1]); s != "in_flight" {
		t.Errorf("row %d is %s after the retry", ids[1], s)
	}
	if s := status(t, db, table, ids[0]); s != "failed" {
		t.Errorf("row %d is %s, not retried", ids[0], s)
	}
	lines, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(lines), `"who":"operator"`) || !strings.Contains(string(lines), `"action":"outbox-retry"`) ||
		!strings.Contains(string(lines), fmt.Sprintf(`"messages":["row:%d"]`, ids[1])) {
		t.Errorf("audit log:\n%s", lines)
	}
	if info, err := os.Stat(audit); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode %v (%v), want 0600", info.Mode(), err)
	}

	// Read-only, the outbox's rows show without a way to retry them.
	base, token, _ = startConsole(t, "--queue", topo.DLQ(), "--audit-log", "-", "--dsn", testDSN(), "--table", table, "--read-only")
	c = browse(t, base, token)
	_, body = fetch(t, c, base+"outbox")
	if !strings.Contains(body, "NOT_FOUND - no exchange") || strings.Contains(body, `action="/outbox/retry"`) || strings.Contains(body, `type="checkbox"`) {
		t.Errorf("the read-only outbox page:\n%s", body)
	}
	if code, _ := submit(t, c, base, "outbox", "outbox/retry", url.Values{"all": {"yes"}}); code != http.StatusForbidden {
		t.Errorf("a read-only retry: %d", code)
	}
	if s := status(t, db, table, ids[0]); s != "failed" {
		t.Errorf("row %d is %s after a read-only retry", ids[0], s)
	}
}

func TestConsoleUsage(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("# who token\nbob short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"console"}, "needs --queue DLQ"},
		{[]string{"console", "--queue", "q", "--limit", "0"}, "--limit expects 1 or more"},
		{[]string{"console", "--queue", "q", "--listen", "0.0.0.0:0"}, "is not a loopback address: give --tokens FILE"},
		{[]string{"console", "--queue", "q", "--listen", ":0"}, "is not a loopback address"},
		{[]string{"console", "--queue", "q", "--tokens", tokens}, `line 2: the token of "bob" is shorter than 16`},
		{[]string{"console", "--queue", "q", "--queues-matching", "("}, "--queues-matching"},
		{[]string{"console", "--queue", "q", "--tls-cert", "x"}, "--tls-cert and --tls-key go together"},
		{[]string{"console", "--queue", "q", "--url", "amqp://u:Pw-secret@host:notaport/"}, "--url"},
		{[]string{"console", "stray"}, "takes no arguments"},
	} {
		code, _, errOut := cli(tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "Pw-secret") || strings.Contains(errOut, "short\n") {
			t.Errorf("%q: exit %d, %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

// With --tokens, the console prints no token and takes those of the file,
// by name; a non-loopback --listen is then allowed.
func TestConsoleTokensFile(t *testing.T) {
	topo := withDeadLetters(t, 1)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("carol 0123456789abcdef-carol\ndave  0123456789abcdef-dave\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &testlog.Buffer{}, &testlog.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"console", "--queue", topo.DLQ(), "--listen", "0.0.0.0:0", "--tokens", tokens, "--audit-log", "-", "--url", brokertest.URL()}, stdout, stderr)
	}()
	line := regexp.MustCompile(`sign in with a token of .* at http://(\[::\]|0\.0\.0\.0):([0-9]+)/login`)
	brokertest.Eventually(t, 10*time.Second, "the console's address", func() bool { return line.MatchString(stdout.String()) })
	port := line.FindStringSubmatch(stdout.String())[2]
	if strings.Contains(stdout.String(), "0123456789abcdef") || !strings.Contains(stderr.String(), "plain HTTP beyond this machine") {
		t.Errorf("stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	if code, _ := fetch(t, c, "http://127.0.0.1:"+port+"/login?token=0123456789abcdef-dave"); code != http.StatusOK {
		t.Errorf("dave's token: %d", code)
	}
	if code, body := fetch(t, c, "http://127.0.0.1:"+port+"/"); code != http.StatusOK || !strings.Contains(body, "dave") {
		t.Errorf("signed in as dave: %d\n%s", code, body)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d: %s", code, stderr.String())
	}
	if strings.Contains(stderr.String(), "0123456789abcdef") {
		t.Errorf("a token reached the log: %s", stderr.String())
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns
// their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "amqpretry console test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// With --tls-cert and --tls-key the console serves HTTPS only, and its
// session cookie is Secure.
func TestConsoleTLS(t *testing.T) {
	topo := withDeadLetters(t, 1)
	certFile, keyFile, pool := selfSigned(t)
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &testlog.Buffer{}, &testlog.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"console", "--queue", topo.DLQ(), "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile,
			"--audit-log", "-", "--url", brokertest.URL()}, stdout, stderr)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("exit %d: %s", code, stderr.String())
		}
	}()
	line := regexp.MustCompile(`sign in \(token "operator"\): (https://127\.0\.0\.1:[0-9]+/)login\?token=([A-Za-z0-9_-]+)`)
	brokertest.Eventually(t, 10*time.Second, "the console's https address", func() bool { return line.MatchString(stdout.String()) })
	m := line.FindStringSubmatch(stdout.String())
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := c.Get(m[1] + "login?token=" + m[2])
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(resp.Cookies()) != 1 || !resp.Cookies()[0].Secure || !resp.Cookies()[0].HttpOnly {
		t.Errorf("sign in over HTTPS: %s, cookies %+v", resp.Status, resp.Cookies())
	}
	if code, _ := fetch(t, c, m[1]); code != http.StatusOK {
		t.Errorf("the overview over HTTPS: %d", code)
	}
	plain := strings.Replace(m[1], "https://", "http://", 1)
	if resp, err := http.Get(plain); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
			t.Errorf("plain HTTP answered %s", resp.Status)
		}
	}
}
