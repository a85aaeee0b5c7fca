package console

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/pubtest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/recoverer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// topology declares a work queue with its DLX and DLQ, deleted when the
// test ends.
func topology(t testing.TB) dlx.Topology {
	t.Helper()
	topo := dlx.Topology{Queue: brokertest.Name(t, "work")}
	t.Cleanup(func() {
		brokertest.DeleteQueue(t, topo.Queue)
		brokertest.DeleteQueue(t, topo.DLQ())
		brokertest.DeleteQueue(t, ArchiveOf(topo.DLQ()))
	})
	if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
		t.Fatal(err)
	}
	return topo
}

// failure is one kind of dead letter: n messages with ids prefix-0...,
// failed with cause(i).
type failure struct {
	prefix string
	n      int
	cause  func(i int) error
}

// threeKinds are the dead letters most tests use: 5 customers not found
// (the id differs), 3 tax timeouts (a UUID and a duration differ) and 2
// validation errors whose text is hostile.
var threeKinds = []failure{
	{"customer", 5, func(i int) error { return fmt.Errorf("customer %d not found", 1000+i*7) }},
	{"tax", 3, func(i int) error {
		return fmt.Errorf("tax service: request %08x-1d2e-4f3a-8b9c-0123456789ab timed out after %dms: %w", i, 3000+i, context.DeadlineExceeded)
	}},
	{"hostile", 2, func(i int) error {
		return middleware.Permanent(fmt.Errorf("bad field <script>document.title='pwned'</script> \u202egnp.exe item %d", i))
	}},
}

// fill puts dead letters of the given kinds on topo's DLQ, as topo's
// recoverer writes them, and returns their count.
func fill(t testing.TB, topo dlx.Topology, kinds []failure) int {
	t.Helper()
	rep := recoverer.Republish(&pubtest.Publisher{}, topo.DLX(), topo.DLQRoutingKey())
	ctx := chainrun.WithQueue(context.Background(), topo.Queue)
	ch := brokertest.Channel(t, brokertest.Dial(t))
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	var confirms []*amqp.DeferredConfirmation
	total := 0
	for _, k := range kinds {
		for i := range k.n {
			d := amqp.Delivery{MessageId: fmt.Sprintf("%s-%d", k.prefix, i), RoutingKey: topo.Queue, ContentType: "application/json",
				Body: []byte(fmt.Sprintf(`{"kind":%q,"n":%d}`, k.prefix, i))}
			msg, err := rep.Message(ctx, &d, k.cause(i))
			if err != nil {
				t.Fatal(err)
			}
			conf, err := ch.PublishWithDeferredConfirm(topo.DLX(), topo.DLQRoutingKey(), true, false, msg)
			if err != nil {
				t.Fatal(err)
			}
			confirms = append(confirms, conf)
			total++
			if len(confirms) == 1000 {
				waitConfirms(t, confirms)
				confirms = confirms[:0]
			}
		}
	}
	waitConfirms(t, confirms)
	return total
}

func waitConfirms(t testing.TB, confirms []*amqp.DeferredConfirmation) {
	t.Helper()
	for _, c := range confirms {
		if !c.Wait() {
			t.Fatal("a dead letter was nacked")
		}
	}
}

// server is a console served on a loopback port for the test.
type server struct {
	*Console
	url   string // http://127.0.0.1:PORT
	token string
	audit *testlog.Buffer
	log   *testlog.Buffer
}

// serve starts a console with cfg (its broker, token and audit log filled
// in when not set) and stops it when the test ends.
func serve(t testing.TB, cfg Config) *server {
	t.Helper()
	s := &server{token: NewToken(), audit: &testlog.Buffer{}, log: &testlog.Buffer{}}
	if cfg.URLs == nil {
		cfg.URLs = []string{brokertest.URL()}
	}
	if cfg.Tokens == nil {
		cfg.Tokens = map[string]string{"alice": s.token}
	}
	if cfg.Audit == nil {
		cfg.Audit = s.audit
	}
	if cfg.Log == nil {
		cfg.Log = newTextLogger(s.log)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Console = c
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.url = "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// client is a browser-like client of a console: it keeps cookies and, on
// a POST, says where it comes from as Chromium does from a page of the
// console: Sec-Fetch-Site: same-origin, and "Origin: null", since the
// console's Referrer-Policy is no-referrer.
type client struct {
	t        testing.TB
	s        *server
	http     *http.Client
	fromPage bool // send the headers of a POST from the console's page
}

// signIn returns a client signed in with the console's token.
func (s *server) signIn(t testing.TB) *client {
	t.Helper()
	c := s.anonymous(t)
	resp, body := c.get("/login?token=" + url.QueryEscape(s.token))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Signed in") {
		t.Fatalf("sign in: %s\n%s", resp.Status, body)
	}
	return c
}

// anonymous returns a client without a session.
func (s *server) anonymous(t testing.TB) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, s: s, fromPage: true, http: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *client) do(req *http.Request) (*http.Response, string) {
	c.t.Helper()
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp, string(b)
}

func (c *client) get(path string) (*http.Response, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.s.url+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.do(req)
}

// post sends form to path, as from the console's page, with the session's CSRF token
// unless form has one; it follows a 303 to its page.
func (c *client) post(path string, form url.Values) (*http.Response, string) {
	c.t.Helper()
	if !form.Has("csrf") {
		form.Set("csrf", c.csrf())
	}
	req, err := http.NewRequest(http.MethodPost, c.s.url+path, strings.NewReader(form.Encode()))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if c.fromPage {
		req.Header.Set("Origin", "null")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	resp, body := c.do(req)
	if resp.StatusCode == http.StatusSeeOther {
		return c.get(resp.Header.Get("Location"))
	}
	return resp, body
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the CSRF token of c's session, read from a page as a browser
// would have it.
func (c *client) csrf() string {
	c.t.Helper()
	// Every signed-in page has it, in its sign-out form.
	_, body := c.get("/result?id=0")
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		c.t.Fatalf("no CSRF token on the page:\n%s", body)
	}
	return m[1]
}

// groupRow matches an overview row: count, original queue, error type,
// the link to the group and its signature.
var groupRow = regexp.MustCompile(`(?s)<td class="n count">([0-9,]+)</td>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>\s*<td class="sig"><a href="/group\?q=[^"]*&amp;g=([0-9a-f]+)&amp;by=[a-z]+">([^<]*)</a>`)

// overviewGroups reads the groups the overview shows: signature → count,
// and signature → group id.
func overviewGroups(t testing.TB, body string) (counts map[string]int, ids map[string]string) {
	t.Helper()
	counts, ids = map[string]int{}, map[string]string{}
	for _, m := range groupRow.FindAllStringSubmatch(body, -1) {
		n := 0
		fmt.Sscan(strings.ReplaceAll(m[1], ",", ""), &n)
		counts[m[5]] = n
		ids[m[5]] = m[4]
	}
	return counts, ids
}

func newTextLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }
