package console

import (
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// Every page and every refusal carries the headers that keep a page inert:
// a CSP without inline script or style, nosniff, no framing, no referrer.
func TestSecurityHeadersOnEveryResponse(t *testing.T) {
	topo := topology(t)
	fill(t, topo, threeKinds[:1])
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	anon := s.anonymous(t)
	responses := map[string]*http.Response{}
	responses["overview"], _ = c.get("/")
	responses["style sheet"], _ = c.get("/static/console.css")
	responses["401"], _ = anon.get("/")
	responses["404"], _ = c.get("/nosuch")
	responses["403"], _ = c.post("/act", url.Values{"csrf": {"forged"}})
	req, _ := http.NewRequest(http.MethodGet, s.url+"/", nil)
	req.Host = "evil.example:80"
	responses["421"], _ = c.do(req)
	for what, resp := range responses {
		h := resp.Header
		csp := h.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") ||
			strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "script-src") {
			t.Errorf("%s: Content-Security-Policy %q", what, csp)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "no-referrer" || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s: headers %v", what, h)
		}
	}
	if ct := responses["style sheet"].Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/css") {
		t.Errorf("style sheet served as %q", ct)
	}
}

// Without a session every page is 401 and every action too; a wrong token
// buys none.
func TestNoTokenNoEntry(t *testing.T) {
	topo := topology(t)
	n := fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	anon := s.anonymous(t)
	for _, path := range []string{"/", "/group?q=" + url.QueryEscape(topo.DLQ()), "/message?q=" + url.QueryEscape(topo.DLQ()) + "&k=id:tax-1", "/result?id=1"} {
		resp, body := anon.get(path)
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "tax") || !strings.Contains(body, `name="token"`) {
			t.Errorf("GET %s without a session: %s\n%s", path, resp.Status, body)
		}
	}
	resp, _ := anon.post("/purge", url.Values{"csrf": {"x"}, "q": {topo.DLQ()}, "name": {topo.DLQ()}})
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("purge without a session: %s", resp.Status)
	}
	resp, _ = anon.get("/login?token=" + url.QueryEscape(s.token+"x"))
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("a wrong token: %s, cookies %v", resp.Status, resp.Cookies())
	}
	if resp, _ := anon.get("/"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("after a wrong token: %s", resp.Status)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != n {
		t.Errorf("the DLQ holds %d, want %d", d, n)
	}
	// Every change is a POST: a GET of an action's address does nothing.
	c := s.signIn(t)
	for _, path := range []string{"/act?q=" + url.QueryEscape(topo.DLQ()) + "&op=delete-selected&k=id:tax-1&confirm=yes", "/purge", "/outbox/retry", "/look", "/logout"} {
		if resp, _ := c.get(path); resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("GET %s: %s", path, resp.Status)
		}
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != n {
		t.Errorf("the DLQ holds %d after GETs, want %d", d, n)
	}
}

// The token buys an HttpOnly, SameSite=Strict cookie, by the sign-in form
// too.
func TestTokenBuysAStrictCookie(t *testing.T) {
	topo := topology(t)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	anon := s.anonymous(t)
	resp, body := anon.post("/login", url.Values{"token": {s.token}, "csrf": {""}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `http-equiv="refresh" content="0; url=/"`) {
		t.Fatalf("sign in: %s\n%s", resp.Status, body)
	}
	cookies := resp.Cookies()
	if len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode || cookies[0].Value == s.token ||
		strings.Contains(cookies[0].Value, s.token) {
		t.Fatalf("cookies %+v", cookies)
	}
	if resp, _ := anon.get("/"); resp.StatusCode != http.StatusOK {
		t.Errorf("with the cookie: %s", resp.Status)
	}
	// Signed out, the cookie buys nothing.
	anon.post("/logout", url.Values{})
	req, _ := http.NewRequest(http.MethodGet, s.url+"/", nil)
	req.AddCookie(cookies[0])
	if resp, _ := s.anonymous(t).do(req); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the cookie after sign-out: %s", resp.Status)
	}
}

// A request whose Host is not the console's is refused before anything
// else (DNS rebinding: another site's page that resolves its name to
// 127.0.0.1 sends its own name); localhost and 127.0.0.1 are the console's.
func TestForeignHostRefused(t *testing.T) {
	topo := topology(t)
	s := serve(t, Config{Queues: []string{topo.DLQ()}, Hosts: []string{"console.internal"}})
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(s.url, "http://"))
	for host, want := range map[string]int{
		"evil.example:" + port:      http.StatusMisdirectedRequest,
		"127.0.0.1.nip.io:" + port:  http.StatusMisdirectedRequest,
		"127.0.0.1:1":               http.StatusMisdirectedRequest,
		"127.0.0.1:" + port:         http.StatusUnauthorized,
		"localhost:" + port:         http.StatusUnauthorized,
		"LOCALHOST:" + port:         http.StatusUnauthorized,
		"[::1]:" + port:             http.StatusUnauthorized,
		"console.internal:" + port:  http.StatusUnauthorized,
		"console.internal.:" + port: http.StatusUnauthorized,
	} {
		req, _ := http.NewRequest(http.MethodGet, s.url+"/login?token="+url.QueryEscape(s.token+"-wrong"), nil)
		req.Host = host
		if resp, _ := s.anonymous(t).do(req); resp.StatusCode != want {
			t.Errorf("Host %q: %s, want %d", host, resp.Status, want)
		}
	}
	// Signed in, the cookie does not help a foreign Host either.
	c := s.signIn(t)
	req, _ := http.NewRequest(http.MethodGet, s.url+"/", nil)
	req.Host = "evil.example:" + port
	if resp, body := c.do(req); resp.StatusCode != http.StatusMisdirectedRequest || strings.Contains(body, topo.DLQ()) {
		t.Errorf("signed in, Host evil.example: %s\n%s", resp.Status, body)
	}
}

// A change from another origin is refused, even with the session's cookie
// and CSRF token: a page on another port of the same host is same-site, so
// its browser sends a SameSite=Strict cookie along.
func TestCrossOriginPostRefused(t *testing.T) {
	topo := topology(t)
	n := fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	_, body := c.get("/")
	_, ids := overviewGroups(t, body)
	csrf := c.csrf()
	form := func() url.Values {
		return url.Values{"csrf": {csrf}, "q": {topo.DLQ()}, "g": {ids["customer &lt;n&gt; not found"]}, "op": {"replay-group"}}
	}
	for _, tc := range []struct {
		name           string
		origin, site   string
		wantStatus     int
		wantInProblem  string
		overrideCSRF   string
		clearOriginHdr bool
	}{
		{name: "same-site page on another port", origin: "http://127.0.0.1:1", site: "same-site", wantStatus: 403, wantInProblem: "did not come from"},
		{name: "cross-site page", origin: "https://evil.example", site: "cross-site", wantStatus: 403, wantInProblem: "did not come from"},
		{name: "Origin only", origin: "http://localhost:1", wantStatus: 403, wantInProblem: "did not come from"},
		{name: "opaque origin", origin: "null", wantStatus: 403, wantInProblem: "did not come from"},
		{name: "opaque origin, same-site", origin: "null", site: "same-site", wantStatus: 403, wantInProblem: "did not come from"},
		{name: "Sec-Fetch-Site decides over Origin", origin: s.url, site: "cross-site", wantStatus: 403, wantInProblem: "did not come from"},
		{name: "Sec-Fetch-Site only", site: "cross-site", wantStatus: 403, wantInProblem: "did not come from"},
		{name: "no CSRF token", origin: s.url, site: "same-origin", overrideCSRF: "-", wantStatus: 403, wantInProblem: "token is missing"},
		{name: "a stale CSRF token", origin: s.url, site: "same-origin", overrideCSRF: NewToken(), wantStatus: 403, wantInProblem: "token is missing"},
	} {
		f := form()
		switch tc.overrideCSRF {
		case "":
		case "-":
			f.Del("csrf")
			f.Set("csrf", "")
		default:
			f.Set("csrf", tc.overrideCSRF)
		}
		req, _ := http.NewRequest(http.MethodPost, s.url+"/act", strings.NewReader(f.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		if tc.site != "" {
			req.Header.Set("Sec-Fetch-Site", tc.site)
		}
		resp, body := c.do(req)
		if resp.StatusCode != tc.wantStatus || !strings.Contains(body, tc.wantInProblem) {
			t.Errorf("%s: %s\n%s", tc.name, resp.Status, body)
		}
	}
	if d, w := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, topo.Queue); d != n || w != 0 {
		t.Fatalf("after refused requests: DLQ %d, work %d; want %d and 0", d, w, n)
	}
	// The same form from the console's own origin works: the refusals were
	// the checks'.
	_, body = c.post("/act", form())
	if _, body = c.post("/act", confirmation(body)); !strings.Contains(body, "replayed 5, 0 left") {
		t.Errorf("from the console's origin:\n%s", body)
	}
}

// Read-only shows no action and refuses every change with 403, even a
// well-formed one with the session's cookie and CSRF token; a look is
// allowed.
func TestReadOnly(t *testing.T) {
	topo := topology(t)
	n := fill(t, topo, threeKinds)
	s := serve(t, Config{Queues: []string{topo.DLQ()}, ReadOnly: true})
	c := s.signIn(t)
	_, overview := c.get("/")
	_, ids := overviewGroups(t, overview)
	id := ids["customer &lt;n&gt; not found"]
	_, group := c.get("/group?q=" + url.QueryEscape(topo.DLQ()) + "&g=" + id)
	_, message := c.get("/message?q=" + url.QueryEscape(topo.DLQ()) + "&k=id:customer-1")
	for what, body := range map[string]string{"overview": overview, "group": group, "message": message} {
		if !strings.Contains(body, "read-only") {
			t.Errorf("%s does not say read-only", what)
		}
		for _, action := range []string{`action="/act"`, `action="/purge"`, `action="/outbox/retry"`, `type="checkbox"`, "Replay", "Delete", "Purge"} {
			if strings.Contains(body, action) {
				t.Errorf("read-only %s shows %s", what, action)
			}
		}
	}
	for _, form := range []url.Values{
		{"q": {topo.DLQ()}, "g": {id}, "op": {"replay-group"}},
		{"q": {topo.DLQ()}, "k": {"id:customer-1"}, "op": {"delete-selected"}, "confirm": {"yes"}},
		{"q": {topo.DLQ()}, "g": {id}, "op": {"delete-group"}, "confirm": {"yes"}},
	} {
		if resp, body := c.post("/act", form); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("read-only %v: %s\n%s", form, resp.Status, body)
		}
	}
	if resp, _ := c.post("/purge", url.Values{"q": {topo.DLQ()}, "name": {topo.DLQ()}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("read-only purge: %s", resp.Status)
	}
	if resp, _ := c.post("/outbox/retry", url.Values{"all": {"yes"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("read-only outbox retry: %s", resp.Status)
	}
	if d, w := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, topo.Queue); d != n || w != 0 {
		t.Fatalf("read-only: DLQ %d, work %d; want %d and 0", d, w, n)
	}
	if s.audit.String() != "" {
		t.Errorf("audit lines for refused actions: %s", s.audit.String())
	}
	if resp, _ := c.post("/look", url.Values{"q": {topo.DLQ()}, "back": {"/"}}); resp.StatusCode != http.StatusOK {
		t.Errorf("read-only look: %s", resp.Status)
	}
}

// Text from a message is escaped as the CLI escapes it, then for HTML: a
// <script> in an exception shows as text, a bidi override as \u202e.
func TestHostileTextInert(t *testing.T) {
	topo := topology(t)
	fill(t, topo, threeKinds)
	hostile := failure{"evil\u202e\x1b[31m<b>", 1, func(int) error { return errString("<img src=x onerror=alert(1)>\u202e\u2066\x00\r\nline") }}
	fill(t, topo, []failure{hostile})
	s := serve(t, Config{Queues: []string{topo.DLQ()}})
	c := s.signIn(t)
	_, overview := c.get("/")
	_, ids := overviewGroups(t, overview)
	var pages []string
	pages = append(pages, overview)
	for _, id := range ids {
		_, body := c.get("/group?q=" + url.QueryEscape(topo.DLQ()) + "&g=" + id)
		pages = append(pages, body)
	}
	for _, k := range []string{"id:hostile-0", "id:evil\u202e\x1b[31m<b>-0"} {
		_, body := c.get("/message?q=" + url.QueryEscape(topo.DLQ()) + "&k=" + url.QueryEscape(Ref(k)))
		if !strings.Contains(body, `id="exception"`) {
			t.Fatalf("message %q:\n%s", k, body)
		}
		pages = append(pages, body)
	}
	for i, body := range pages {
		for _, raw := range []string{"<script>", "<img", "<b>", "\u202e", "\u2066", "\x1b", "\x00", "onerror=alert(1)>"} {
			if strings.Contains(body, raw) {
				t.Errorf("page %d holds %q raw", i, raw)
			}
		}
	}
	message := pages[len(pages)-1]
	for _, shown := range []string{`&lt;img src=x onerror=alert(1)&gt;\u202e\u2066\x00\r`, `evil\u202e\x1b[31m&lt;b&gt;-0`} {
		if !strings.Contains(message, shown) {
			t.Errorf("the message page does not show %q:\n%s", shown, message)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }
