package consoletest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// Names the browser resolves to 127.0.0.1 (startBrowser): rebindHost as a
// DNS rebinding attack would have it, otherSite as another site.
const (
	rebindHost = "rebind.test"
	otherSite  = "other.test"
)

// The three kinds of failure the listener meets, and how many of each.
var kinds = []struct {
	name string
	n    int
}{{"customer", 5}, {"tax", 3}, {"hostile", 2}}

// hostileText is what the hostile kind's error says: markup that would run
// if a page let it, and a bidi override that would reverse "exe.png".
const hostileText = `bad field <script>window.pwned=1</script><img src=x onerror="window.pwned=2"> ` + "\u202e" + `gnp.exe item`

// app is the handler a real listener runs: customers are not found until
// fixed is set, the tax service times out, hostile input is refused for
// good. It records the ids it handled.
type app struct {
	fixed   atomic.Bool
	mu      sync.Mutex
	handled []string
}

func (a *app) handle(_ context.Context, d *amqp.Delivery) error {
	var m struct {
		Kind string
		N    int
	}
	if err := json.Unmarshal(d.Body, &m); err != nil {
		return middleware.Permanent(err)
	}
	switch m.Kind {
	case "customer":
		if !a.fixed.Load() {
			return fmt.Errorf("customer %d not found", 1000+m.N*7)
		}
	case "tax":
		return fmt.Errorf("tax service: request %08x-1d2e-4f3a-8b9c-0123456789ab timed out after %dms", m.N*7919, 3000+m.N*13)
	case "hostile":
		return middleware.Permanent(fmt.Errorf("%s %d", hostileText, m.N))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.handled = append(a.handled, d.MessageId)
	return nil
}

func (a *app) handledIDs() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(slices.Values(a.handled))
}

// deadLetters declares a work queue "orders-<random>" with its DLX and DLQ,
// runs a listener on it that republishes failures to the DLQ, and publishes
// the three kinds of message; it returns once all ten are dead letters, with
// the listener still running (until the test ends).
func deadLetters(t *testing.T) (dlx.Topology, *app) {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	topo := dlx.Topology{Queue: "orders-" + hex.EncodeToString(b[:])}
	t.Cleanup(func() {
		brokertest.DeleteQueue(t, topo.Queue)
		brokertest.DeleteQueue(t, topo.DLQ())
		brokertest.DeleteQueue(t, topo.DLQ()+".archive")
	})
	if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
		t.Fatal(err)
	}
	pub, err := publisher.New(brokertest.URL(), publisher.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	a := &app{}
	l, err := listener.New(topo.Queue, middleware.Chain(middleware.Recover(recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey()))),
		a.handle, listener.WithURL(brokertest.URL()), listener.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("listener: %v", err)
		}
	})
	total := 0
	for _, k := range kinds {
		for i := range k.n {
			brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: fmt.Sprintf("%s-%d", k.name, i), ContentType: "application/json",
				Body: []byte(fmt.Sprintf(`{"kind":%q,"n":%d}`, k.name, i))})
			total++
		}
	}
	brokertest.Eventually(t, 20*time.Second, "every message on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == total })
	t.Logf("%d dead letters on %s", total, topo.DLQ())
	return topo, a
}

var quiet = slog.New(slog.DiscardHandler)

var signIn = regexp.MustCompile(`sign in \(token "operator"\): (http://127\.0\.0\.1:([0-9]+)/)login\?token=([A-Za-z0-9_-]+)`)

// console is an `amqpretry console` process.
type console struct {
	base, port, login, token string
	audit                    string // the audit log's path
}

// startConsole starts the command on dlq with extra flags, on a free
// loopback port, and stops it (with ^C, as an operator would) when the test
// ends.
func startConsole(t *testing.T, dlq string, extra ...string) *console {
	t.Helper()
	c := &console{audit: filepath.Join(t.TempDir(), "audit.jsonl")}
	args := append([]string{"console", "--queue", dlq, "--listen", "127.0.0.1:0", "--url", brokertest.URL(), "--audit-log", c.audit}, extra...)
	cmd := exec.Command(command, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := make(chan []string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			if m := signIn.FindStringSubmatch(scanner.Text()); m != nil {
				found <- m
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		<-read
		if err := cmd.Wait(); err != nil {
			t.Errorf("amqpretry console: %v\n%s", err, stderr.String())
		} else if t.Failed() {
			t.Logf("amqpretry console's log:\n%s", stderr.String())
		}
	})
	select {
	case m := <-found:
		c.base, c.port, c.token = m[1], m[2], m[3]
		c.login = m[1] + "login?token=" + m[3]
	case <-read:
		t.Fatalf("amqpretry console ended before it served:\n%s", stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("amqpretry console printed no sign-in address:\n%s", stderr.String())
	}
	return c
}

// signedIn opens the console's printed address in a fresh browser context,
// which signs in and moves on to the overview.
func signedIn(t *testing.T, c *console) context.Context {
	t.Helper()
	ctx := browser(t)
	run(t, ctx, chromedp.Navigate(c.login))
	// The signed-in page moves on by itself (a meta refresh): wait for the
	// overview's document, loaded.
	waitFor(t, ctx, "the overview after signing in",
		`document.readyState === "complete" && location.pathname === "/" && ((document.querySelector("h1") || {}).textContent || "").startsWith("Dead letters")`)
	return ctx
}

// run runs actions with a deadline, failing the test on an error.
func run(t *testing.T, ctx context.Context, actions ...chromedp.Action) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Run(ctx, actions...); err != nil {
		t.Fatalf("browser: %v", err)
	}
}

// leftMark marks a document follow has left: the next one does not carry
// it.
const leftMark = `document.documentElement.dataset.amqpretryLeft`

// follow runs actions that leave the page (a click on a link or on a
// form's button) and waits until the next page has loaded and sel matches
// in it. Nothing looks into a document while the browser replaces it: a
// query that did (chromedp.WaitVisible right after a click) could hold a
// node of the old document and fail with "No node with given id found".
func follow(t *testing.T, ctx context.Context, sel string, actions ...chromedp.Action) {
	t.Helper()
	// The page acted on has loaded: a click lands on it, not on the one
	// before.
	waitFor(t, ctx, "the page before the click", `document.readyState === "complete"`)
	run(t, ctx, chromedp.Evaluate(leftMark+` = "1"`, nil))
	run(t, ctx, actions...)
	waitFor(t, ctx, "the next page, with "+sel, fmt.Sprintf(
		`document.readyState === "complete" && %s === undefined && document.querySelector(%q) !== null`, leftMark, sel))
}

// waitFor waits until the JavaScript expression cond is true in the
// current page, asking again while the browser is between two documents
// (an evaluation then fails, and is not an answer).
func waitFor(t *testing.T, ctx context.Context, what, cond string) {
	t.Helper()
	brokertest.Eventually(t, 20*time.Second, what, func() bool {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var ok bool
		return chromedp.Run(ctx, chromedp.Evaluate(`!!(`+cond+`)`, &ok)) == nil && ok
	})
}

// textNow is the text of the first element sel matches, "" if none or the
// page is between two documents: for polling.
func textNow(ctx context.Context, sel string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var s string
	js := fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel)
	if err := chromedp.Run(ctx, chromedp.Evaluate(js, &s)); err != nil {
		return ""
	}
	return s
}

// text is the visible text of the first element sel matches, once the page
// has loaded and has one. It reads by evaluation, asking again while the
// browser is between two documents, never through a node of a document
// that may be gone by the time it is read.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	js := fmt.Sprintf(`(() => { const e = document.readyState === "complete" && document.querySelector(%q); return e ? e.innerText : null; })()`, sel)
	var s *string
	brokertest.Eventually(t, 20*time.Second, sel+" on a loaded page", func() bool {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		s = nil
		return chromedp.Run(ctx, chromedp.Evaluate(js, &s)) == nil && s != nil
	})
	return *s
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	var v T
	run(t, ctx, chromedp.Evaluate(js, &v))
	return v
}

// shot saves a screenshot of the whole page as name.png in
// $AMQPRETRY_SCREENSHOTS, if set.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("AMQPRETRY_SCREENSHOTS")
	if dir == "" {
		return
	}
	var png []byte
	run(t, ctx, chromedp.FullScreenshot(&png, 100))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// groups reads the overview's groups: signature → count.
func groups(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	rows := eval[[][]string](t, ctx, `Array.from(document.querySelectorAll("tr.group")).map(r => [r.querySelector(".sig").textContent, r.querySelector(".count").textContent])`)
	out := map[string]string{}
	for _, r := range rows {
		out[r[0]] = r[1]
	}
	return out
}

// groupLink clicks the overview's link to the group whose signature starts
// with prefix.
func groupLink(prefix string) chromedp.Action {
	return chromedp.Click(fmt.Sprintf(`//td[@class="sig"]/a[starts-with(normalize-space(.), %q)]`, prefix), chromedp.BySearch)
}

// The main path: dead letters of three kinds, made by a real
// listener, show as three groups with their counts; replaying the one whose
// cause is fixed puts exactly its five messages back on the work queue, the
// listener handles them, and the page says what was done.
func TestBrowserGroupsAndReplay(t *testing.T) {
	needBrowser(t)
	topo, a := deadLetters(t)
	c := startConsole(t, topo.DLQ())
	ctx := signedIn(t, c)

	got := groups(t, ctx)
	want := map[string]string{
		"customer <n> not found":                            "5",
		"tax service: request <uuid> timed out after <n>ms": "3",
		`bad field <script>window.pwned=<n></script><img src=x onerror="window.pwned=<n>"> \u202egnp.exe item <n>`: "2",
	}
	if len(got) != 3 {
		t.Fatalf("the overview shows %d groups, want 3: %v", len(got), got)
	}
	for sig, n := range want {
		if got[sig] != n {
			t.Errorf("group %q: %q, want %s (all: %q)", sig, got[sig], n, got)
		}
	}
	if s := text(t, ctx, "p.snapinfo"); !strings.Contains(s, "10 of 10 messages") {
		t.Errorf("snapshot line: %q", s)
	}
	// The style sheet applies under the Content-Security-Policy.
	if bg := eval[string](t, ctx, `getComputedStyle(document.querySelector("header.top")).backgroundColor`); bg != "rgb(22, 33, 46)" {
		t.Errorf("the header's background is %q: the style sheet did not apply", bg)
	}
	shot(t, ctx, "overview")

	a.fixed.Store(true) // the deploy that fixes the customer lookup
	follow(t, ctx, `#replay-group`, groupLink("customer"))
	shot(t, ctx, "group")
	// "Replay all 5" asks first, with the count.
	follow(t, ctx, `#confirm-replay`, chromedp.Click(`#replay-group`, chromedp.ByQuery))
	if h := text(t, ctx, "h1"); h != "Replay 5 messages from "+topo.DLQ()+"?" {
		t.Errorf("the confirmation asks %q", h)
	}
	shot(t, ctx, "confirm-replay")
	if d := brokertest.Depth(t, topo.DLQ()); d != 10 {
		t.Fatalf("the DLQ holds %d while the replay is unconfirmed", d)
	}
	follow(t, ctx, `#summary`, chromedp.Click(`#confirm-replay`, chromedp.ByQuery))
	if s := text(t, ctx, "#summary"); !strings.Contains(s, "replayed 5, 0 left on "+topo.DLQ()) {
		t.Fatalf("the result says %q", s)
	}
	shot(t, ctx, "replayed")
	brokertest.Eventually(t, 20*time.Second, "the listener handled the five customers", func() bool { return len(a.handledIDs()) >= 5 })
	if ids := a.handledIDs(); !slices.Equal(ids, []string{"customer-0", "customer-1", "customer-2", "customer-3", "customer-4"}) {
		t.Errorf("the listener handled %q, want the five customers", ids)
	}
	if d, w := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, topo.Queue); d != 5 || w != 0 {
		t.Errorf("DLQ %d, work queue %d: want 5 and 0", d, w)
	}
	audit, err := os.ReadFile(c.audit)
	if err != nil || !strings.Contains(string(audit), `"who":"operator"`) || !strings.Contains(string(audit), `"action":"replay"`) ||
		!strings.Contains(string(audit), `"done":5`) {
		t.Errorf("audit log (%v):\n%s", err, audit)
	}
	// Back on the overview, two groups are left.
	follow(t, ctx, `table.groups`, chromedp.Click(`#back`, chromedp.ByQuery))
	if got := groups(t, ctx); len(got) != 2 {
		t.Errorf("after the replay the overview shows %v", got)
	}
}

// A delete shows what it would take and does it only when confirmed,
// moving the messages to the DLQ's archive, whose page restores them; a
// purge does nothing unless the queue's name is typed.
func TestBrowserDeleteAndPurgeAskFirst(t *testing.T) {
	needBrowser(t)
	topo, _ := deadLetters(t)
	c := startConsole(t, topo.DLQ())
	ctx := signedIn(t, c)

	follow(t, ctx, `#delete-group`, groupLink("tax"))
	follow(t, ctx, `#confirm-delete`, chromedp.Click(`#delete-group`, chromedp.ByQuery))
	if h := text(t, ctx, "h1"); h != "Delete (archive) 3 messages from "+topo.DLQ()+"?" {
		t.Errorf("the confirmation asks %q", h)
	}
	shot(t, ctx, "confirm-delete")
	if d := brokertest.Depth(t, topo.DLQ()); d != 10 {
		t.Fatalf("the DLQ holds %d while the delete is unconfirmed", d)
	}
	follow(t, ctx, `table.groups`, chromedp.Click(`#cancel`, chromedp.ByQuery))
	if d := brokertest.Depth(t, topo.DLQ()); d != 10 {
		t.Fatalf("the DLQ holds %d after cancelling", d)
	}
	follow(t, ctx, `#delete-group`, groupLink("tax"))
	follow(t, ctx, `#confirm-delete`, chromedp.Click(`#delete-group`, chromedp.ByQuery))
	follow(t, ctx, `#summary`, chromedp.Click(`#confirm-delete`, chromedp.ByQuery))
	if s := text(t, ctx, "#summary"); !strings.Contains(s, "archived 3 to "+topo.DLQ()+".archive, 0 left") {
		t.Errorf("the result says %q", s)
	}
	archive := topo.DLQ() + ".archive"
	if d, w, a := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, topo.Queue), brokertest.Depth(t, archive); d != 7 || w != 0 || a != 3 {
		t.Fatalf("DLQ %d, work %d, archive %d after the delete: want 7, 0 and 3", d, w, a)
	}

	// The archive shows on the overview; its group's page restores.
	run(t, ctx, chromedp.Navigate(c.base))
	follow(t, ctx, `#restore-group`, groupLink("tax"))
	follow(t, ctx, `#confirm-restore`, chromedp.Click(`#restore-group`, chromedp.ByQuery))
	if h := text(t, ctx, "h1"); h != "Restore 3 messages from "+archive+"?" {
		t.Errorf("the restore's confirmation asks %q", h)
	}
	follow(t, ctx, `#summary`, chromedp.Click(`#confirm-restore`, chromedp.ByQuery))
	if s := text(t, ctx, "#summary"); !strings.Contains(s, "restored 3") {
		t.Errorf("the restore says %q", s)
	}
	if d, a := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, archive); d != 10 || a != 0 {
		t.Fatalf("DLQ %d, archive %d after the restore: want 10 and 0", d, a)
	}

	// Purge: the name typed wrong, then right.
	purge := func(typed string) {
		run(t, ctx, chromedp.Navigate(c.base))
		waitFor(t, ctx, "the overview", `document.readyState === "complete" && document.querySelector("details.danger summary") !== null`)
		run(t, ctx, chromedp.Click(`details.danger summary`, chromedp.ByQuery), chromedp.WaitVisible(`form.purge input[name=name]`, chromedp.ByQuery),
			chromedp.SendKeys(`form.purge input[name=name]`, typed, chromedp.ByQuery))
		if typed == topo.DLQ() {
			shot(t, ctx, "purge")
		}
		follow(t, ctx, `h1`, chromedp.Click(`form.purge button`, chromedp.ByQuery))
	}
	purge(topo.Queue)
	if p := text(t, ctx, "#problem"); !strings.Contains(p, "Nothing was purged") {
		t.Errorf("a purge with the wrong name says %q", p)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != 10 {
		t.Fatalf("the DLQ holds %d after a purge with the wrong name", d)
	}
	purge(topo.DLQ())
	if s := text(t, ctx, "#summary"); !strings.Contains(s, "purged 10") {
		t.Errorf("the purge says %q", s)
	}
	if d := brokertest.Depth(t, topo.DLQ()); d != 0 {
		t.Errorf("the DLQ holds %d after the purge", d)
	}
}

// The checks that change nothing share one DLQ of ten dead letters: the
// read-only console, the refusals, hostile text.
func TestBrowserLookingAndRefusing(t *testing.T) {
	needBrowser(t)
	topo, _ := deadLetters(t)
	t.Run("ReadOnly", func(t *testing.T) { readOnly(t, topo) })
	t.Run("Refusals", func(t *testing.T) { refusals(t, topo) })
	t.Run("HostileTextInert", func(t *testing.T) { hostileTextInert(t, topo) })
}

// Read-only shows no action on any page, and a POST forged in the signed-in
// page, with the session's cookie and CSRF token, gets 403.
func readOnly(t *testing.T, topo dlx.Topology) {
	c := startConsole(t, topo.DLQ(), "--read-only")
	ctx := signedIn(t, c)
	const actions = `document.querySelectorAll('form[action="/act"], form[action="/purge"], form[action="/outbox/retry"], input[type=checkbox], button.danger').length`
	if n := eval[int](t, ctx, actions); n != 0 {
		t.Errorf("the read-only overview shows %d actions", n)
	}
	if b := text(t, ctx, ".badge"); b != "read-only" {
		t.Errorf("badge %q", b)
	}
	shot(t, ctx, "read-only")
	follow(t, ctx, `table.messages`, groupLink("customer"))
	if n := eval[int](t, ctx, actions); n != 0 {
		t.Errorf("the read-only group page shows %d actions", n)
	}
	group := eval[string](t, ctx, `new URLSearchParams(location.search).get("g")`)
	follow(t, ctx, `#body`, chromedp.Click(`table.messages a`, chromedp.ByQuery))
	if n := eval[int](t, ctx, actions); n != 0 {
		t.Errorf("the read-only message page shows %d actions", n)
	}
	// A forged POST from the console's own page: same origin, the cookie,
	// the session's CSRF token.
	forge := fmt.Sprintf(`(() => {
		const f = document.createElement("form"); f.method = "post"; f.action = "/act";
		const add = (n, v) => { const i = document.createElement("input"); i.type = "hidden"; i.name = n; i.value = v; f.appendChild(i); };
		add("csrf", document.querySelector("input[name=csrf]").value); add("q", %q); add("g", %q); add("op", "replay-group");
		document.body.appendChild(f); f.submit(); return true; })()`, topo.DLQ(), group)
	eval[bool](t, ctx, forge)
	brokertest.Eventually(t, 10*time.Second, "the answer to the forged POST", func() bool { return strings.HasPrefix(textNow(ctx, "h1"), "403") })
	if p := text(t, ctx, "#problem"); !strings.Contains(p, "read-only") {
		t.Errorf("the forged POST got %q", p)
	}
	if d, w := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, topo.Queue); d != 10 || w != 0 {
		t.Errorf("DLQ %d, work %d after the forged POST: want 10 and 0", d, w)
	}
}

// Without the token a browser gets 401 and the sign-in form; a page of
// another origin cannot make the signed-in browser act (403, or 401 from
// another site, whose requests carry no SameSite=Strict cookie); a name
// that resolves here but is not the console's is refused (421).
func refusals(t *testing.T, topo dlx.Topology) {
	c := startConsole(t, topo.DLQ())

	anon := browser(t)
	for _, u := range []string{c.base, c.base + "login?token=" + c.token + "x"} {
		resp, err := chromedp.RunResponse(anon, chromedp.Navigate(u))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != http.StatusUnauthorized || text(t, anon, "h1") != "Sign in" {
			t.Errorf("%s without the token: %d, %q", u, resp.Status, text(t, anon, "h1"))
		}
	}
	shot(t, anon, "sign-in")

	ctx := signedIn(t, c)
	csrf := eval[string](t, ctx, `document.querySelector("input[name=csrf]").value`)
	follow(t, ctx, `#replay-group`, groupLink("customer"))
	group := eval[string](t, ctx, `new URLSearchParams(location.search).get("g")`)
	// The attacker's page knows even the CSRF token: the origin checks
	// alone stop it.
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><title>prize</title><form method="post" action="%sact">
<input type="hidden" name="csrf" value="%s"><input type="hidden" name="q" value="%s"><input type="hidden" name="g" value="%s">
<input type="hidden" name="op" value="replay-group"><button id="go">Claim your prize</button></form>`, c.base, csrf, topo.DLQ(), group)
	}))
	defer attacker.Close()
	port := attacker.URL[strings.LastIndex(attacker.URL, ":")+1:]
	for _, tc := range []struct{ page, want string }{
		{attacker.URL, "403"}, // same site (127.0.0.1), another port: the cookie goes along
		{"http://" + otherSite + ":" + port + "/", "Sign in"}, // another site: no cookie at all
	} {
		run(t, ctx, chromedp.Navigate(tc.page))
		follow(t, ctx, `h1`, chromedp.Click(`#go`, chromedp.ByQuery))
		brokertest.Eventually(t, 10*time.Second, "the console's answer to "+tc.page, func() bool {
			return strings.HasPrefix(textNow(ctx, "h1"), tc.want)
		})
		if tc.want == "403" {
			if p := text(t, ctx, "#problem"); !strings.Contains(p, "did not come from the console's own pages") {
				t.Errorf("the cross-origin POST got %q", p)
			}
			shot(t, ctx, "cross-origin-refused")
		}
	}
	if d, w := brokertest.Depth(t, topo.DLQ()), brokertest.Depth(t, topo.Queue); d != 10 || w != 0 {
		t.Errorf("DLQ %d, work %d after the cross-origin POSTs: want 10 and 0", d, w)
	}

	// DNS rebinding: rebind.test resolves to 127.0.0.1, the browser sends its
	// own name as Host.
	resp, err := chromedp.RunResponse(ctx, chromedp.Navigate("http://"+rebindHost+":"+c.port+"/"))
	if err != nil {
		t.Fatal(err)
	}
	body := text(t, ctx, "body")
	if resp.Status != http.StatusMisdirectedRequest || strings.Contains(body, topo.DLQ()) {
		t.Errorf("Host %s: %d\n%s", rebindHost, resp.Status, body)
	}
}

// An exception holding markup and a bidi override shows as text: no
// element it names exists, no script of it ran, the override shows as
// \u202e.
func hostileTextInert(t *testing.T, topo dlx.Topology) {
	c := startConsole(t, topo.DLQ())
	ctx := signedIn(t, c)
	type page struct {
		Title   string
		Pwned   string
		Scripts int
		Images  int
	}
	const inspect = `({Title: document.title, Pwned: typeof window.pwned, Scripts: document.scripts.length, Images: document.images.length})`
	check := func(where, title string) {
		t.Helper()
		p := eval[page](t, ctx, inspect)
		if p.Title != title || p.Pwned != "undefined" || p.Scripts != 0 || p.Images != 0 {
			t.Errorf("%s: %+v", where, p)
		}
	}
	check("overview", "Dead letters · amqpretry console")
	follow(t, ctx, `table.messages`, groupLink("bad field"))
	check("group", "Group · amqpretry console")
	follow(t, ctx, `#exception`, chromedp.Click(`table.messages a`, chromedp.ByQuery))
	check("message", "Message · amqpretry console")
	exc := text(t, ctx, "#exception")
	if !strings.Contains(exc, `<script>window.pwned=1</script><img src=x onerror="window.pwned=2"> \u202egnp.exe item`) || strings.Contains(exc, "\u202e") {
		t.Errorf("the exception shows as %q", exc)
	}
	shot(t, ctx, "hostile-message")
}

// deadLetter is a dead letter as the recoverer writes it onto a DLQ of a
// work queue: its fault headers, failed at at.
func deadLetter(work, id, exception string, at time.Time) amqp.Publishing {
	return amqp.Publishing{MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent,
		Body: []byte(fmt.Sprintf(`{"id":%q}`, id)),
		Headers: amqp.Table{
			recoverer.HeaderExceptionMessage:                              exception,
			recoverer.DefaultHeaderPrefix + recoverer.SuffixOriginalQueue: work,
			recoverer.DefaultHeaderPrefix + recoverer.SuffixErrorType:     "*errors.errorString",
			recoverer.DefaultHeaderPrefix + recoverer.SuffixFailedAt:      at.UTC().Format(time.RFC3339Nano),
		}}
}

// dlqOf declares a durable DLQ of its own, deleted (with its archive) when
// the test ends, and returns its name and its work queue's.
func dlqOf(t *testing.T) (dlq, work string) {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	work = "orders-" + hex.EncodeToString(b[:])
	dlq = work + ".dlq"
	brokertest.Queue(t, dlq, nil)
	t.Cleanup(func() { brokertest.DeleteQueue(t, dlq+".archive") })
	return dlq, work
}

// A look at a DLQ of thousands reads all of them (a consumer, one nack
// back), shows them grouped, and leaves every one on the queue, look after
// look.
func TestBrowserLooksAtThousands(t *testing.T) {
	needBrowser(t)
	const n = 3000
	dlq, work := dlqOf(t)
	now := time.Now()
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = deadLetter(work, fmt.Sprintf("order-%d", i), fmt.Sprintf("customer %d not found", i), now.Add(-time.Duration(i)*time.Second))
	}
	brokertest.Publish(t, dlq, msgs...)
	c := startConsole(t, dlq)
	ctx := signedIn(t, c)
	before := ""
	for look := range 3 {
		s := text(t, ctx, "p.snapinfo")
		if !strings.Contains(s, "3,000 of 3,000 messages") {
			t.Errorf("look %d: the snapshot line says %q", look, s)
		}
		if s == before {
			t.Errorf("look %d: Look again took no new snapshot: %q", look, s)
		}
		before = s
		if got := groups(t, ctx); got["customer <n> not found"] != "3,000" {
			t.Errorf("look %d: groups %v", look, got)
		}
		if d := brokertest.Depth(t, dlq); d != n {
			t.Fatalf("look %d: the DLQ holds %d, want %d", look, d, n)
		}
		follow(t, ctx, `p.snapinfo`, chromedp.Click(`form[action="/look"] button`, chromedp.ByQuery))
	}
}

// chartOf reads the chart sel matches: the counts it says it holds, its
// first bucket's start, its step, and the counts its bars draw.
type chartRead struct {
	Buckets string
	From    string
	Step    int
	Bars    []int
	State   string
}

func readChart(t *testing.T, ctx context.Context, sel string) chartRead {
	t.Helper()
	waitFor(t, ctx, sel, fmt.Sprintf(`document.readyState === "complete" && document.querySelector(%q) !== null`, sel))
	return eval[chartRead](t, ctx, fmt.Sprintf(`(() => { const s = document.querySelector(%q);
		return {Buckets: s.dataset.buckets, From: s.dataset.from, Step: Number(s.dataset.step),
			Bars: Array.from(s.querySelectorAll("rect.bar")).map(r => Number(r.dataset.n)),
			State: s.classList.contains("now") ? "now" : "stopped"}; })()`, sel))
}

// wantBuckets counts times into the buckets c says it has, as a person
// reading its axis would: bucket i holds [from + i·step, from + (i+1)·step).
func wantBuckets(t *testing.T, c chartRead, times []time.Time) string {
	t.Helper()
	from, err := time.Parse(time.RFC3339, c.From)
	if err != nil || c.Step <= 0 {
		t.Fatalf("the chart says from %q, step %d", c.From, c.Step)
	}
	n := len(strings.Split(c.Buckets, ","))
	counts := make([]string, n)
	got := make([]int, n)
	step := time.Duration(c.Step) * time.Second
	for _, at := range times {
		i := int(at.Sub(from) / step)
		if i < 0 || i >= n {
			t.Fatalf("a failure at %s falls outside the chart's %d buckets of %v from %s", at, n, step, from)
		}
		got[i]++
	}
	for i, k := range got {
		counts[i] = fmt.Sprint(k)
	}
	return strings.Join(counts, ",")
}

// wantState is what a chart c should say of a group whose newest failure
// is at newest: failing now when that falls in its last bucket (the one
// holding the snapshot), else stopped.
func wantState(t *testing.T, c chartRead, newest time.Time) string {
	t.Helper()
	from, err := time.Parse(time.RFC3339, c.From)
	if err != nil {
		t.Fatal(err)
	}
	n := len(strings.Split(c.Buckets, ","))
	if !newest.Before(from.Add(time.Duration(n-1) * time.Duration(c.Step) * time.Second)) {
		return "now"
	}
	return "stopped"
}

// nonZero is the counts of s, comma-separated, without the zeros: what the
// bars draw.
func nonZero(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var n int
		fmt.Sscan(f, &n)
		if n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// A DLQ a real listener fills: each group's chart counts every dead letter
// of the group, in the intervals the listener ran in (by the failure time
// the recoverer wrote), and draws the group failing now.
func TestBrowserChartOfARealListenersDeadLetters(t *testing.T) {
	needBrowser(t)
	began := time.Now()
	topo, _ := deadLetters(t)
	ended := time.Now()
	c := startConsole(t, topo.DLQ())
	ctx := signedIn(t, c)
	rows := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("tr.group .count")).map(c => c.textContent)`)
	if len(rows) != len(kinds) {
		t.Fatalf("%d groups on the overview, want %d", len(rows), len(kinds))
	}
	for i, count := range rows {
		ch := readChart(t, ctx, fmt.Sprintf(`tr.group:nth-of-type(%d) svg.chart`, i+1))
		from, err := time.Parse(time.RFC3339, ch.From)
		if err != nil || ch.Step <= 0 {
			t.Fatalf("group %d: the chart says from %q, step %d", i+1, ch.From, ch.Step)
		}
		step := time.Duration(ch.Step) * time.Second
		first, last := int(began.Truncate(time.Second).Sub(from)/step), int(ended.Add(time.Second).Sub(from)/step)
		total := 0
		for b, f := range strings.Split(ch.Buckets, ",") {
			var n int
			fmt.Sscan(f, &n)
			total += n
			if n > 0 && (b < first || b > last) {
				t.Errorf("group %d: %d failures in interval %d, outside the listener's run (intervals %d to %d): %s", i+1, n, b, first, last, ch.Buckets)
			}
		}
		if fmt.Sprint(total) != count {
			t.Errorf("group %d: the chart counts %d failures, the group %s: %s", i+1, total, count, ch.Buckets)
		}
		if ch.State != "now" {
			t.Errorf("group %d: dead-lettered seconds ago, drawn as %q", i+1, ch.State)
		}
	}
}

// A DLQ filled over four hours: customers failing every two minutes for the
// last hour, up to now, and the tax service failing for an hour until three
// hours ago. The overview draws each group's failures per interval across
// the snapshot's span, the customers' as failing now and the tax service's
// as stopped 3 h ago; the group's page draws the same with axes, ticks and a
// legend.
func TestBrowserFailuresOverTime(t *testing.T) {
	needBrowser(t)
	dlq, work := dlqOf(t)
	now := time.Now()
	var customers, taxes []time.Time
	var msgs []amqp.Publishing
	for i := range 30 {
		at := now.Add(-time.Duration(i) * 2 * time.Minute)
		customers = append(customers, at)
		msgs = append(msgs, deadLetter(work, fmt.Sprintf("customer-%d", i), fmt.Sprintf("customer %d not found", 1000+i), at))
	}
	for i := range 40 {
		at := now.Add(-3*time.Hour - time.Duration(i)*90*time.Second)
		taxes = append(taxes, at)
		msgs = append(msgs, deadLetter(work, fmt.Sprintf("tax-%d", i), fmt.Sprintf("tax service: request %d timed out", i), at))
	}
	brokertest.Publish(t, dlq, msgs...)
	c := startConsole(t, dlq)
	ctx := signedIn(t, c)

	sel := func(i int) string { return fmt.Sprintf(`tr.group:nth-of-type(%d) svg.chart`, i) }
	// The overview lists the larger group first: tax (40), customers (30).
	if got := groups(t, ctx); got["tax service: request <n> timed out"] != "40" || got["customer <n> not found"] != "30" {
		t.Fatalf("groups %v", got)
	}
	// The customers' newest failure, as the test began, is in the last
	// interval but when the snapshot's interval began in between (a minute
	// or ten just turned): the test reads which from the chart.
	states := map[string]string{}
	for i, tc := range []struct {
		name  string
		times []time.Time
	}{{"tax", taxes}, {"customers", customers}} {
		ch := readChart(t, ctx, sel(i+1))
		if want := wantBuckets(t, ch, tc.times); ch.Buckets != want {
			t.Errorf("%s: the overview's chart counts %s, want %s", tc.name, ch.Buckets, want)
		}
		if !slices.Equal(ch.Bars, nonZero(ch.Buckets)) {
			t.Errorf("%s: bars %v for buckets %s", tc.name, ch.Bars, ch.Buckets)
		}
		state := wantState(t, ch, tc.times[0])
		states[tc.name] = state
		activity := text(t, ctx, fmt.Sprintf(`tr.group:nth-of-type(%d) .activity`, i+1))
		if ch.State != state || (state == "now") != (activity == "failing now") || (state == "stopped") != strings.HasPrefix(activity, "stopped ") {
			t.Errorf("%s: drawn as %q and says %q, want %q", tc.name, ch.State, activity, state)
		}
		if tc.name == "tax" && activity != "stopped 3 h ago" {
			t.Errorf("tax says %q", activity)
		}
	}
	if states["customers"] != "now" {
		t.Logf("the customers' newest failure fell just before the snapshot's interval: drawn as stopped")
	} else {
		// Failing now and stopped look different.
		colours := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("tr.group svg.chart rect.bar:last-of-type")).map(r => getComputedStyle(r).fill)`)
		if len(colours) != 2 || colours[0] == colours[1] {
			t.Errorf("the bars of a stopped and a failing group are coloured %v", colours)
		}
	}
	shot(t, ctx, "console-charts")

	follow(t, ctx, `svg.chart.big`, groupLink("customer"))
	big := readChart(t, ctx, `svg.chart.big`)
	if want := wantBuckets(t, big, customers); big.Buckets != want {
		t.Errorf("the group page's chart counts %s, want %s", big.Buckets, want)
	}
	state := wantState(t, big, customers[0])
	if !slices.Equal(big.Bars, nonZero(big.Buckets)) || big.State != state {
		t.Errorf("the group page's chart: bars %v, state %s, want %s", big.Bars, big.State, state)
	}
	ticks := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("svg.chart.big text.xtick")).map(e => e.textContent)`)
	yticks := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("svg.chart.big text.ytick")).map(e => e.textContent)`)
	if len(ticks) < 3 || len(yticks) < 2 || yticks[0] != "0" {
		t.Errorf("the axes are labelled %v and %v", ticks, yticks)
	}
	if l := text(t, ctx, "p.legend"); !strings.Contains(l, "failures in each") || !strings.Contains(l, "the snapshot") {
		t.Errorf("the legend says %q", l)
	}
	if a := text(t, ctx, "#activity"); (state == "now") != (a == "failing now") {
		t.Errorf("the group page says %q, drawn as %s", a, state)
	}
	shot(t, ctx, "group-chart")
}

// The search box, on every page, finds one message among a thousand on
// two queues — by message id, correlation id, a header's value or the
// body's text, in any case — and its result links to the message.
func TestBrowserSearchFindsOneInAThousand(t *testing.T) {
	needBrowser(t)
	dlq, work := dlqOf(t)
	other, _ := dlqOf(t)
	now := time.Now()
	var msgs []amqp.Publishing
	for i := range 1000 {
		m := deadLetter(work, fmt.Sprintf("order-%04d", i), fmt.Sprintf("customer %d not found", i), now.Add(-time.Duration(i)*time.Second))
		m.CorrelationId = fmt.Sprintf("corr-%04d", i)
		m.Headers["tenant"] = fmt.Sprintf("tenant-%04d", i)
		msgs = append(msgs, m)
	}
	brokertest.Publish(t, dlq, msgs[:500]...)
	brokertest.Publish(t, other, msgs[500:]...)
	needle := deadLetter(work, "order-needle", "tax service timed out", now)
	needle.CorrelationId = "corr-Zebra-77"
	needle.Headers["tenant"] = "Wombat Holdings"
	needle.Body = []byte(`{"sku":"ocelot-<b>9</b>"}`)
	brokertest.Publish(t, other, needle)
	c := startConsole(t, dlq, "--queue", other)
	ctx := signedIn(t, c)

	search := func(query string) {
		t.Helper()
		waitFor(t, ctx, "the search box", `document.readyState === "complete" && document.querySelector("form.search input[name=s]") !== null`)
		run(t, ctx, chromedp.SetValue(`form.search input[name=s]`, query, chromedp.ByQuery))
		follow(t, ctx, `#searchinfo`, chromedp.Click(`form.search button`, chromedp.ByQuery))
	}
	for _, tc := range []struct{ query, where string }{
		{"order-needle", "message id"},
		{"CORR-zebra-77", "correlation id"},
		{"wombat", "header tenant"},
		{"ocelot-<b>9", "body"},
	} {
		search(tc.query)
		hits := eval[[][]string](t, ctx, `Array.from(document.querySelectorAll("tr.hit")).map(r => [r.cells[0].textContent, r.cells[1].textContent, r.querySelector("mark").textContent])`)
		if len(hits) != 1 || hits[0][0] != "order-needle" || hits[0][1] != tc.where || !strings.EqualFold(hits[0][2], tc.query) {
			t.Errorf("%q found %q, want order-needle in its %s", tc.query, hits, tc.where)
		}
		if s := text(t, ctx, "#searchinfo"); !strings.HasPrefix(s, "1 message hold") || !strings.Contains(s, "of the 1,001 in the snapshots") {
			t.Errorf("%q: %q", tc.query, s)
		}
		if n := eval[int](t, ctx, `document.querySelectorAll("tr.hit b").length`); n != 0 {
			t.Errorf("%q: the body's markup became %d elements", tc.query, n)
		}
	}
	shot(t, ctx, "search")
	// A search that matches many lists them all; the result links to the
	// message.
	search("tenant-01")
	if n := eval[int](t, ctx, `document.querySelectorAll("tr.hit").length`); n != 100 {
		t.Errorf("tenant-01 found %d, want 100", n)
	}
	search("order-needle")
	follow(t, ctx, `#body`, chromedp.Click(`tr.hit a`, chromedp.ByQuery))
	if h := text(t, ctx, "h1"); h != "Message order-needle" {
		t.Errorf("the hit's link leads to %q", h)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("form.search input[name=s]").length`); n != 1 {
		t.Errorf("the message page has %d search boxes", n)
	}
}

// The overview says how many dead letters arrived since its snapshot, and,
// asked to through its link, reloads itself without script: dead letters
// published while the page sits open show up on it by themselves.
func TestBrowserOverviewLive(t *testing.T) {
	needBrowser(t)
	dlq, work := dlqOf(t)
	now := time.Now()
	var msgs []amqp.Publishing
	for i := range 10 {
		msgs = append(msgs, deadLetter(work, fmt.Sprintf("order-%d", i), "customer not found", now))
	}
	brokertest.Publish(t, dlq, msgs...)
	c := startConsole(t, dlq)
	ctx := signedIn(t, c)
	if n := eval[int](t, ctx, `document.querySelectorAll('meta[http-equiv="refresh"]').length`); n != 0 {
		t.Fatalf("the overview reloads itself unasked (%d)", n)
	}
	follow(t, ctx, `#refreshing`, chromedp.Click(`a.refresh`, chromedp.ByQuery))
	if s := text(t, ctx, "#refreshing"); s != "This page reloads every 10 s" {
		t.Errorf("the reload says %q", s)
	}
	// The page is left alone from here: only its own reload can show these.
	brokertest.Publish(t, dlq, deadLetter(work, "late-1", "customer not found", time.Now()), deadLetter(work, "late-2", "customer not found", time.Now()))
	arrived := `p.arrived strong`
	waitFor(t, ctx, "the page, reloaded, saying 2 arrived",
		fmt.Sprintf(`document.readyState === "complete" && ((document.querySelector(%q) || {}).textContent || "") === "2 dead letters arrived since the snapshot"`, arrived))
	if s := text(t, ctx, "p.snapinfo"); !strings.Contains(s, "10 of 10 messages") || !strings.Contains(s, "The queue holds 12 now") {
		t.Errorf("the snapshot line says %q", s)
	}
	shot(t, ctx, "live")
	// Look again: the arrivals are in the snapshot, and the page keeps
	// reloading. The clicks are made on the page reloading every hour, so
	// that no reload replaces the page under a click.
	run(t, ctx, chromedp.Navigate(c.base+"?by=cause&refresh=3600"))
	follow(t, ctx, `p.snapinfo`, chromedp.Click(`form[action="/look"] button`, chromedp.ByQuery))
	if s := text(t, ctx, "p.snapinfo"); !strings.Contains(s, "12 of 12 messages") {
		t.Errorf("after Look again: %q", s)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("p.arrived").length`); n != 0 {
		t.Errorf("after Look again: %d arrival lines", n)
	}
	if every := eval[string](t, ctx, `(document.querySelector('meta[http-equiv="refresh"]') || {}).content || ""`); every != "3600" {
		t.Errorf("after Look again the page reloads every %q s", every)
	}
	follow(t, ctx, `p.live`, chromedp.Click(`#stop-refresh`, chromedp.ByQuery))
	if n := eval[int](t, ctx, `document.querySelectorAll('meta[http-equiv="refresh"]').length`); n != 0 {
		t.Errorf("stop left the reload on")
	}
}

// Edit and replay: a dead letter refused for good (hostile input) is
// edited into one the handler takes, its header added; the form refuses
// a body that is not the JSON its content type says, the review shows what
// changes and replays nothing, and the confirmed copy reaches the listener,
// marked edited, while the audit log keeps the original.
func TestBrowserEditAndReplay(t *testing.T) {
	needBrowser(t)
	topo, a := deadLetters(t)
	a.fixed.Store(true)
	c := startConsole(t, topo.DLQ())
	ctx := signedIn(t, c)

	follow(t, ctx, `table.messages`, groupLink("bad field"))
	follow(t, ctx, `#edit-message`, chromedp.Click(`table.messages a`, chromedp.ByQuery))
	id := strings.TrimPrefix(text(t, ctx, "h1"), "Message ")
	follow(t, ctx, `#edit-form`, chromedp.Click(`#edit-message`, chromedp.ByQuery))
	if body := eval[string](t, ctx, `document.querySelector("#edit-body").value`); !strings.Contains(body, `"kind":"hostile"`) {
		t.Errorf("the form starts with the body %q", body)
	}
	shot(t, ctx, "console-edit")
	edit := func(body, headers string) {
		t.Helper()
		run(t, ctx, chromedp.SetValue(`#edit-body`, body, chromedp.ByQuery), chromedp.SetValue(`#edit-headers`, headers, chromedp.ByQuery))
		follow(t, ctx, `h1`, chromedp.Click(`#review-edit`, chromedp.ByQuery))
	}
	edit(`{"kind":"customer",`, `{"tenant":"acme"}`)
	if p := text(t, ctx, "#problem"); !strings.Contains(p, "not valid JSON") {
		t.Errorf("a body that is not JSON: %q", p)
	}
	if body := eval[string](t, ctx, `document.querySelector("#edit-body").value`); body != `{"kind":"customer",` {
		t.Errorf("the form lost what was typed: %q", body)
	}
	edit(`{"kind":"customer","n":99}`, `{"tenant":"acme"}`)
	if h := text(t, ctx, "#header-changes"); h != "added tenant" {
		t.Errorf("the review lists %q", h)
	}
	if b := text(t, ctx, "#body-change"); b != "changed" {
		t.Errorf("the review says the body is %q", b)
	}
	shot(t, ctx, "confirm-edit")
	if d := brokertest.Depth(t, topo.DLQ()); d != 10 {
		t.Fatalf("the DLQ holds %d before the edit is confirmed", d)
	}
	follow(t, ctx, `#summary`, chromedp.Click(`#confirm-edit`, chromedp.ByQuery))
	if s := text(t, ctx, "#summary"); !strings.Contains(s, "replayed 1 edited, 0 left on "+topo.DLQ()) {
		t.Errorf("the result says %q", s)
	}
	brokertest.Eventually(t, 20*time.Second, "the listener handled the edited copy", func() bool { return slices.Contains(a.handledIDs(), id) })
	if d := brokertest.Depth(t, topo.DLQ()); d != 9 {
		t.Errorf("the DLQ holds %d after the edit, want 9", d)
	}
	audit, err := os.ReadFile(c.audit)
	if err != nil {
		t.Fatal(err)
	}
	var entry struct {
		Action, Who string
		Edit        struct {
			OriginalBody  string         `json:"original_body"`
			EditedBody    string         `json:"edited_body"`
			EditedHeaders map[string]any `json:"edited_headers"`
		}
	}
	lines := strings.Split(strings.TrimSpace(string(audit)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &entry); err != nil || entry.Action != "edit" || entry.Who != "operator" ||
		!strings.Contains(entry.Edit.OriginalBody, `"kind":"hostile"`) || entry.Edit.EditedBody != `{"kind":"customer","n":99}` || entry.Edit.EditedHeaders["tenant"] != "acme" {
		t.Errorf("audit (%v): %s", err, lines[len(lines)-1])
	}
}
