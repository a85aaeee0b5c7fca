package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/escape"
	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/outbox"
)

// Bounds on what one page lists.
const (
	maxGroups       = 200 // groups per queue on the overview
	messagesPerPage = 500 // messages per page of a group
	maxConfirmList  = 20  // message ids a confirmation lists
)

// setBase sets the context actions run under: they outlive the request that
// started them (a closed tab does not cut a replay short), not the server.
func (c *Console) setBase(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.baseCtx = ctx
}

func (c *Console) base() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.baseCtx == nil {
		return context.Background()
	}
	return c.baseCtx
}

// handler is a page or an action of a signed-in session.
type handler func(w http.ResponseWriter, r *http.Request, s *session)

func (c *Console) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(staticFiles)))
	mux.HandleFunc("GET /login", c.loginGet)
	mux.HandleFunc("POST /login", c.loginPost)
	mux.Handle("GET /{$}", c.page(c.overview))
	mux.Handle("GET /group", c.page(c.groupPage))
	mux.Handle("GET /message", c.page(c.messagePage))
	mux.Handle("GET /search", c.page(c.search))
	mux.Handle("GET /outbox", c.page(c.outboxPage))
	mux.Handle("GET /result", c.page(c.resultPage))
	mux.Handle("GET /edit", c.page(c.editForm))
	mux.Handle("POST /edit", c.change(c.editPost, false))
	mux.Handle("POST /look", c.change(c.lookPost, true))
	mux.Handle("POST /logout", c.change(c.logoutPost, true))
	mux.Handle("POST /act", c.change(c.act, false))
	mux.Handle("POST /purge", c.change(c.purgePost, false))
	mux.Handle("POST /outbox/retry", c.change(c.outboxRetry, false))
	return mux
}

// page serves h to a signed-in session; anyone else gets 401 and the
// sign-in form.
func (c *Console) page(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := c.auth.session(r)
		if s == nil {
			c.loginForm(w, r, http.StatusUnauthorized, "")
			return
		}
		h(w, r, s)
	})
}

// change serves h, a POST that changes something, to a signed-in session
// only if it comes from the console's own pages (same origin, the session's
// CSRF token) and, unless allowedReadOnly, the console is not read-only.
func (c *Console) change(h handler, allowedReadOnly bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := c.auth.session(r)
		if s == nil {
			c.loginForm(w, r, http.StatusUnauthorized, "")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 8<<20)
		if !sameOrigin(r, c.cfg.SecureCookie) {
			c.log.Warn("console: refused a cross-origin request", "path", r.URL.Path, "origin", r.Header.Get("Origin"),
				"sec-fetch-site", r.Header.Get("Sec-Fetch-Site"), "who", s.who, "remote", r.RemoteAddr)
			c.fail(w, r, s, http.StatusForbidden, "Refused: this request did not come from the console's own pages.")
			return
		}
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, s, http.StatusBadRequest, "The form could not be read: "+err.Error())
			return
		}
		if !validCSRF(s, r.PostFormValue("csrf")) {
			c.log.Warn("console: refused a request without the session's CSRF token", "path", r.URL.Path, "who", s.who, "remote", r.RemoteAddr)
			c.fail(w, r, s, http.StatusForbidden, "Refused: the form's token is missing or stale. Reload the page and try again.")
			return
		}
		if c.cfg.ReadOnly && !allowedReadOnly {
			c.log.Warn("console: refused an action: read-only", "path", r.URL.Path, "who", s.who, "remote", r.RemoteAddr)
			c.fail(w, r, s, http.StatusForbidden, "Refused: this console is read-only (amqpretry console --read-only).")
			return
		}
		h(w, r, s)
	})
}

func (c *Console) loginGet(w http.ResponseWriter, r *http.Request) {
	token := r.URL.Query().Get("token")
	if token == "" {
		c.loginForm(w, r, http.StatusOK, "")
		return
	}
	c.signIn(w, r, token)
}

func (c *Console) loginPost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !sameOrigin(r, c.cfg.SecureCookie) {
		c.loginForm(w, r, http.StatusForbidden, "Refused: this request did not come from the console's own pages.")
		return
	}
	c.signIn(w, r, r.PostFormValue("token"))
}

// signIn exchanges a token for a session cookie, and leaves the token out
// of the address bar: the page it answers with moves on to the overview,
// from the console's own origin, which a SameSite=Strict cookie needs on
// its first use.
func (c *Console) signIn(w http.ResponseWriter, r *http.Request, token string) {
	who, ok := c.auth.check(token)
	if !ok {
		c.log.Warn("console: refused a token", "remote", r.RemoteAddr)
		c.loginForm(w, r, http.StatusUnauthorized, "That token is not one of this console's.")
		return
	}
	c.auth.login(w, who)
	c.log.Info("console: signed in", "who", who, "remote", r.RemoteAddr)
	c.render.page(w, http.StatusOK, "signedin", c.view(nil, "Signed in", nil))
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request, status int, problem string) {
	c.render.page(w, status, "login", c.view(nil, "Sign in", struct{ Problem string }{problem}))
}

func (c *Console) logoutPost(w http.ResponseWriter, r *http.Request, s *session) {
	c.auth.logout(w, r)
	c.loginForm(w, r, http.StatusOK, "")
}

// view is what every page template gets.
type view struct {
	Title     string
	Signed    bool
	Who       string
	CSRF      string
	ReadOnly  bool
	Broker    string
	HasOutbox bool
	Search    string // the search box's text
	Page      any
}

func (c *Console) view(s *session, title string, page any) view {
	v := view{Title: title, ReadOnly: c.cfg.ReadOnly, HasOutbox: c.cfg.Outbox != nil, Page: page}
	redacted := make([]string, len(c.cfg.URLs))
	for i, u := range c.cfg.URLs {
		redacted[i] = amqpurl.Redact(u)
	}
	v.Broker = strings.Join(redacted, ", ")
	if s != nil {
		v.Signed, v.Who, v.CSRF = true, s.who, s.csrf
	}
	return v
}

// fail answers with an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, status int, problem string) {
	c.render.page(w, status, "error", c.view(s, http.StatusText(status), struct {
		Status  int
		Problem string
	}{status, c.redact(problem)}))
}

func groupByOf(r *http.Request) GroupBy {
	if GroupBy(r.FormValue("by")) == ByStack {
		return ByStack
	}
	return ByCause
}

// queueView is one queue on the overview.
type queueView struct {
	Name       string
	Depth      int // now; -1 unknown
	Snap       *Snapshot
	Err        string
	Groups     []overviewGroup
	MoreGroups int
	Cost       string
	Span       Span // the time its groups' charts share
	// Arrived is how many more ready messages the queue holds now than
	// the snapshot left it (its depth then, less what the console's
	// actions took since): dead letters that arrived since; negative when
	// something else took some.
	Arrived int
}

// overviewGroup is a group on the overview, with its chart of failures over
// time.
type overviewGroup struct {
	*Group
	Chart chartView
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	by := groupByOf(r)
	queues, listErr := c.Queues(ctx)
	page := struct {
		Queues  []queueView
		ListErr string
		By      GroupBy
		Recent  []AuditEntry
		Refresh int // seconds between reloads; 0: none
		Every   []int
	}{By: by, Recent: c.audit.latest(), Refresh: refreshOf(r), Every: refreshChoices}
	if listErr != nil {
		page.ListErr = c.redact(listErr.Error())
	}
	for _, q := range c.withArchives(ctx, queues) {
		qv := queueView{Name: q, Depth: -1}
		snap, err := c.Snapshot(ctx, q, false)
		if err != nil {
			qv.Err = c.redact(err.Error())
		} else {
			qv.Snap = snap
			groups := Groups(snap.Messages, by)
			qv.Span = queueSpan(snap, sparkBuckets)
			for _, g := range groups[:min(len(groups), maxGroups)] {
				qv.Groups = append(qv.Groups, overviewGroup{g, sparkChart(qv.Span, g)})
			}
			qv.MoreGroups = len(groups) - len(qv.Groups)
			qv.Cost = CostNote(snap)
			if d, err := c.Depth(ctx, q); err == nil {
				qv.Depth = d
				qv.Arrived = d - (snap.Depth - snap.Removed)
			}
		}
		page.Queues = append(page.Queues, qv)
	}
	c.render.page(w, http.StatusOK, "overview", c.view(s, "Dead letters", page))
}

// Bounds on how often the overview reloads itself (?refresh=N): no more
// often than every 5 s, at least every hour.
const (
	minRefresh = 5
	maxRefresh = 3600
)

// refreshChoices are the intervals the overview offers.
var refreshChoices = []int{10, 30, 60}

// refreshOf is the overview's reload interval the request asks for, within
// the bounds; 0 when it asks for none (or for something that is not a
// number).
func refreshOf(r *http.Request) int {
	n, err := strconv.Atoi(r.FormValue("refresh"))
	if err != nil || n <= 0 {
		return 0
	}
	return max(minRefresh, min(n, maxRefresh))
}

// withArchives is queues, each followed by its archive once a delete has
// made one: the overview shows it after its queue, with Restore where the
// queue has Replay.
func (c *Console) withArchives(ctx context.Context, queues []string) []string {
	var shown []string
	for _, q := range queues {
		shown = append(shown, q)
		if a := ArchiveOf(q); !IsArchive(q) && !slices.Contains(queues, a) {
			if _, err := c.Depth(ctx, a); err == nil {
				shown = append(shown, a)
			}
		}
	}
	return shown
}

// searchQueue is what a search found on one queue.
type searchQueue struct {
	Name  string
	Snap  *Snapshot
	Err   string
	Hits  []Hit
	Total int
}

// search finds messages of the console's queues, in their snapshots (a look
// at a queue that has none), by message id, correlation id, a header or the
// body: the s parameter, in any case.
func (c *Console) search(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	query := strings.TrimSpace(r.FormValue("s"))
	page := struct {
		Query    string
		TooLong  bool
		Queues   []searchQueue
		Total    int
		Searched int
		Listed   int
		ListErr  string
		MaxHits  int
	}{Query: query, MaxHits: maxHits}
	if utf8.RuneCountInString(query) > maxQuery {
		page.TooLong, page.Query = true, ""
	}
	if page.Query != "" {
		queues, listErr := c.Queues(ctx)
		if listErr != nil {
			page.ListErr = c.redact(listErr.Error())
		}
		for _, q := range c.withArchives(ctx, queues) {
			sq := searchQueue{Name: q}
			snap, err := c.Snapshot(ctx, q, false)
			if err != nil {
				sq.Err = c.redact(err.Error())
			} else {
				sq.Snap = snap
				sq.Hits, sq.Total = Search(snap, page.Query, maxHits-page.Listed)
				page.Listed += len(sq.Hits)
				page.Total += sq.Total
				page.Searched += len(snap.Messages)
			}
			page.Queues = append(page.Queues, sq)
		}
	}
	v := c.view(s, "Search", page)
	v.Search = query
	c.render.page(w, http.StatusOK, "search", v)
}

// findGroup is the group with id in snap grouped by.
func findGroup(snap *Snapshot, by GroupBy, id string) *Group {
	for _, g := range Groups(snap.Messages, by) {
		if g.ID == id {
			return g
		}
	}
	return nil
}

// shownOrFail reports whether q is one of the console's queues, answering
// 404 when it is not.
func (c *Console) shownOrFail(w http.ResponseWriter, r *http.Request, s *session, q string) bool {
	if c.shown(r.Context(), q) {
		return true
	}
	c.fail(w, r, s, http.StatusNotFound, fmt.Sprintf("%s is not one of this console's queues.", escape.Line(q)))
	return false
}

// pageSnapshot is the look at q that a page about it shows, or nil after
// answering why there is none (not one of the console's queues, or the
// broker did not answer).
func (c *Console) pageSnapshot(w http.ResponseWriter, r *http.Request, s *session, q string) *Snapshot {
	if !c.shownOrFail(w, r, s, q) {
		return nil
	}
	snap, err := c.Snapshot(r.Context(), q, false)
	if err != nil {
		c.fail(w, r, s, http.StatusBadGateway, err.Error())
		return nil
	}
	return snap
}

func (c *Console) groupPage(w http.ResponseWriter, r *http.Request, s *session) {
	q, id, by := r.FormValue("q"), r.FormValue("g"), groupByOf(r)
	snap := c.pageSnapshot(w, r, s, q)
	if snap == nil {
		return
	}
	g := findGroup(snap, by, id)
	if g == nil {
		c.fail(w, r, s, http.StatusNotFound, "No such group in the latest look at "+escape.Line(q)+": its messages may have been replayed or deleted.")
		return
	}
	pageNo, _ := strconv.Atoi(r.FormValue("page"))
	pages := (g.Count() + messagesPerPage - 1) / messagesPerPage
	pageNo = max(0, min(pageNo, pages-1))
	from := pageNo * messagesPerPage
	shown := g.Messages[from:min(len(g.Messages), from+messagesPerPage)]
	page := struct {
		Queue    string
		Snap     *Snapshot
		Group    *Group
		By       GroupBy
		Messages []*Message
		Shown    int // the page's number, from 1
		Pages    int
		Prev     int // the previous page's page parameter; -1 on the first
		Next     int // the next page's; -1 on the last
		Cost     string
		Listed   string // the group's Selection.Digest, for "Replay all" and "Delete all"
		Chart    chartView
	}{q, snap, g, by, shown, pageNo + 1, pages, pageNo - 1, -1, CostNote(snap), GroupSelection(g).Digest(), bigChart(NewSpan(g.FirstFailed, snap.Taken, bigBuckets), g)}
	if pageNo+1 < pages {
		page.Next = pageNo + 1
	}
	c.render.page(w, http.StatusOK, "group", c.view(s, "Group", page))
}

// bodyView is a message body as the message page shows it.
type bodyView struct {
	Kind     string // text, json, hex
	Text     string // escaped
	NotShown int    // bytes of a hex dump left out
	CanJSON  bool
	Binary   bool
	Size     int
}

// maxBodyShown bounds the part of a body the message page shows as text or
// JSON: a page of megabytes helps nobody.
const maxBodyShown = 256 << 10

func viewBody(body []byte, asked string) bodyView {
	v := bodyView{Size: len(body), Binary: escape.IsBinary(body), CanJSON: json.Valid(body)}
	if v.Kind = "text"; len(body) > maxBodyShown && asked != "hex" && !v.Binary {
		// Cut on a character boundary; the JSON view needs the whole body.
		cut := maxBodyShown
		for cut > 0 && !utf8.RuneStart(body[cut]) {
			cut--
		}
		v.Text, v.NotShown = block(string(body[:cut])), len(body)-cut
		return v
	}
	switch {
	case asked == "hex" || (asked == "" && v.Binary):
		v.Kind = "hex"
		v.Text, v.NotShown = escape.HexDump(body)
	case (asked == "json" || asked == "") && v.CanJSON:
		var b bytes.Buffer
		if err := json.Indent(&b, body, "", "  "); err == nil {
			v.Kind, v.Text = "json", block(b.String())
			break
		}
		fallthrough
	default:
		v.Kind, v.Text = "text", block(string(body))
	}
	return v
}

func (c *Console) messagePage(w http.ResponseWriter, r *http.Request, s *session) {
	q, key := r.FormValue("q"), Unref(r.FormValue("k"))
	snap := c.pageSnapshot(w, r, s, q)
	if snap == nil {
		return
	}
	msgs := snap.ByKey(key)
	if len(msgs) == 0 {
		c.fail(w, r, s, http.StatusNotFound, "No message "+escape.Line(key)+" in the latest look at "+escape.Line(q)+": it may have been replayed or deleted.")
		return
	}
	by := groupByOf(r)
	// Messages of several groups may share a key (a business key as message
	// id): a link from a group's page names the group.
	m, same := msgs[0], len(msgs)
	if g := findGroup(snap, by, r.FormValue("g")); g != nil {
		var mine []*Message
		for _, o := range msgs {
			if g.Has(o) {
				mine = append(mine, o)
			}
		}
		if len(mine) > 0 {
			m, same = mine[0], len(mine)
		}
	}
	sig, _ := signatureOf(m, by)
	page := struct {
		Queue   string
		Snap    *Snapshot
		M       *Message
		Same    int // messages of its group with the same key
		Others  int // messages of other groups with the same key
		Body    bodyView
		Headers []headerView
		Deaths  []deathView
		GroupID string
		By      GroupBy
	}{Queue: q, Snap: snap, M: m, Same: same, Others: len(msgs) - same, Body: viewBody(m.Delivery.Body, r.FormValue("view")),
		Headers: headersOf(m.Delivery.Headers), Deaths: deathsOf(m.Delivery.Headers),
		GroupID: groupID(by, m.OriginalQueue, m.ErrorType, sig), By: by}
	c.render.page(w, http.StatusOK, "message", c.view(s, "Message", page))
}

// localPath is back if it is a path of this console, else "/": a form's
// "back" field must not redirect anywhere else.
func localPath(back string) string {
	u, err := url.Parse(back)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !strings.HasPrefix(u.Path, "/") ||
		strings.HasPrefix(back, "//") || strings.ContainsAny(back, "\\\r\n") {
		return "/"
	}
	return back
}

func (c *Console) lookPost(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.PostFormValue("q")
	if !c.shown(r.Context(), q) {
		c.fail(w, r, s, http.StatusNotFound, fmt.Sprintf("%s is not one of this console's queues.", escape.Line(q)))
		return
	}
	if _, err := c.Snapshot(r.Context(), q, true); err != nil {
		c.fail(w, r, s, http.StatusBadGateway, err.Error())
		return
	}
	http.Redirect(w, r, localPath(r.PostFormValue("back")), http.StatusSeeOther)
}

// act replays or deletes the messages a form names: op is replay-group,
// replay-selected, delete-group or delete-selected; a group is one of the
// latest look (g, by), a selection the keys the form lists (k), of group g
// when the form names one (so that a message of another group with the same
// key is not taken). A delete and a replay of a whole group show a
// confirmation first, which carries the digest of what it listed
// (Selection.Digest): when that has changed by the time it is confirmed,
// nothing is done and a fresh confirmation is shown.
func (c *Console) act(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.PostFormValue("q")
	op, scope, _ := strings.Cut(r.PostFormValue("op"), "-")
	if (op != "replay" && op != "delete" && op != "restore") || (scope != "group" && scope != "selected") || (op == "restore") != IsArchive(q) {
		c.fail(w, r, s, http.StatusBadRequest, "Unknown action "+escape.Line(r.PostFormValue("op"))+".")
		return
	}
	if !c.shownOrFail(w, r, s, q) {
		return
	}
	snap := c.current(q)
	if snap == nil {
		c.fail(w, r, s, http.StatusConflict, "Look at "+escape.Line(q)+" first: the console has no snapshot of it.")
		return
	}
	by := groupByOf(r)
	var group *Group
	if id := r.PostFormValue("g"); id != "" || scope == "group" {
		if group = findGroup(snap, by, id); group == nil {
			c.fail(w, r, s, http.StatusConflict, "That group is no longer in the latest look at "+escape.Line(q)+": its messages may have been replayed or deleted.")
			return
		}
	}
	var sel Selection
	if scope == "group" {
		sel = GroupSelection(group)
	} else {
		keys := make([]string, 0, len(r.PostForm["k"]))
		for _, ref := range r.PostForm["k"] {
			keys = append(keys, Unref(ref))
		}
		sel = TickedSelection(snap, group, keys)
	}
	if len(sel.Keys) == 0 {
		c.fail(w, r, s, http.StatusBadRequest, "No message selected: tick the messages to act on, or use the group's buttons.")
		return
	}
	dest := Destination{Kind: r.PostFormValue("to"), Queue: strings.TrimSpace(r.PostFormValue("to_queue"))}
	if op == "replay" {
		if _, err := dest.option(); err != nil {
			c.fail(w, r, s, http.StatusBadRequest, "Nothing was replayed: "+err.Error()+".")
			return
		}
	}
	if op != "replay" || scope == "group" {
		cv := confirmView{Op: op, Scope: scope, Queue: q, Group: group, By: by, Dest: dest, Was: -1}
		listed, digest := r.PostFormValue("listed"), sel.Digest()
		confirmed := r.PostFormValue("confirm") == "yes"
		if !confirmed || listed != digest {
			// A confirmation that does not carry what this would take now
			// (a later look found more, an action took some) is refused; a
			// page that listed something else is told.
			status := http.StatusOK
			if cv.Stale = confirmed || (listed != "" && listed != digest); cv.Stale {
				cv.Confirming = confirmed
				if n, err := strconv.Atoi(r.PostFormValue("n")); err == nil && n >= 0 {
					cv.Was = n
				}
			}
			if confirmed {
				status = http.StatusConflict
				c.log.Warn("console: refused a confirmation of what has changed since", "who", s.who, "remote", r.RemoteAddr,
					"queue", q, "action", op+"-"+scope, "listed", cv.Was, "now", sel.Requested())
			}
			c.confirm(w, r, s, status, cv, sel)
			return
		}
	}
	var out Outcome
	actx, cancel := context.WithCancel(c.base())
	defer cancel()
	switch op {
	case "replay":
		out = c.Replay(actx, q, sel, dest)
	case "restore":
		out = c.Restore(actx, q, sel)
	default:
		out = c.Delete(actx, q, sel, s.who)
	}
	entry := c.entry(r, s, out)
	entry.Messages, entry.MessagesNotListed = auditKeys(sortedKeys(sel.Keys))
	if group != nil {
		entry.Group = group.ID + " " + escape.Line(group.Signature)
	}
	c.finish(w, r, s, out, entry)
}

// confirmView is what a confirmation page shows.
type confirmView struct {
	Op    string // replay, delete or restore
	Scope string // group or selected
	Queue string
	Count int
	Group *Group // the group acted on, or the ticked messages' group; nil: none
	By    GroupBy
	Dest  Destination
	// Keys are the form's k fields, for ticked messages; Listed the keys
	// the page lists, More how many it leaves out.
	Keys   []string
	Listed []string
	More   int
	Digest string // of the selection: the form carries it (Selection.Digest)
	// Stale says that the page the request came from listed something
	// else: Was messages (-1: unknown), Confirming when that page was a
	// confirmation (refused).
	Stale      bool
	Confirming bool
	Was        int
}

// confirm shows what an action on sel would take, with a form that does
// it.
func (c *Console) confirm(w http.ResponseWriter, r *http.Request, s *session, status int, cv confirmView, sel Selection) {
	sorted := sortedKeys(sel.Keys)
	cv.Count, cv.Digest = sel.Requested(), sel.Digest()
	cv.Listed, cv.More = sorted[:min(len(sorted), maxConfirmList)], max(0, len(sorted)-maxConfirmList)
	if cv.Scope != "group" {
		for _, k := range sorted {
			cv.Keys = append(cv.Keys, Ref(k))
		}
	}
	title := "Confirm " + cv.Op
	c.render.page(w, status, "confirm", c.view(s, title, cv))
}

func (c *Console) purgePost(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.PostFormValue("q")
	if !c.shown(r.Context(), q) {
		c.fail(w, r, s, http.StatusNotFound, fmt.Sprintf("%s is not one of this console's queues.", escape.Line(q)))
		return
	}
	if r.PostFormValue("name") != q {
		c.fail(w, r, s, http.StatusBadRequest, "Nothing was purged: type the queue's name exactly ("+escape.Line(q)+") to purge it.")
		return
	}
	actx, cancel := context.WithCancel(c.base())
	defer cancel()
	out := c.Purge(actx, q)
	c.finish(w, r, s, out, c.entry(r, s, out))
}

func (c *Console) entry(r *http.Request, s *session, out Outcome) AuditEntry {
	e := AuditEntry{Time: out.Time.UTC(), Who: s.who, Remote: r.RemoteAddr, Action: out.Action, Queue: out.Queue,
		Destination: out.Destination, Requested: out.Requested, Done: out.Done, Left: out.Left, Depth: out.Depth,
		Outcome: "ok", Summary: out.Summary()}
	if out.Err != nil {
		e.Outcome, e.Error = "failed", c.redact(out.Err.Error())
	}
	return e
}

// result is what the result page shows of an action.
type result struct {
	ID       int
	Outcome  Outcome
	Summary  string
	Error    string
	AuditErr string
}

// finish records an action's audit line and sends the browser to its
// result (POST, redirect, GET: a reload does not do it again).
func (c *Console) finish(w http.ResponseWriter, r *http.Request, s *session, out Outcome, entry AuditEntry) {
	res := &result{Outcome: out, Summary: out.Summary(), Error: entry.Error}
	if err := c.audit.record(entry); err != nil {
		res.AuditErr = c.redact(err.Error())
		c.log.Error("console: the audit log could not be written", "err", res.AuditErr, "entry", entry.Summary)
	}
	c.log.Info("console: "+out.Action, "who", s.who, "queue", out.Queue, "summary", res.Summary, "error", res.Error)
	c.mu.Lock()
	c.resultSeq++
	res.ID = c.resultSeq
	c.results[res.ID] = res
	delete(c.results, res.ID-maxResults)
	c.mu.Unlock()
	http.Redirect(w, r, "/result?id="+strconv.Itoa(res.ID), http.StatusSeeOther)
}

// maxResults is how many results the console keeps for their pages.
const maxResults = 100

func (c *Console) resultPage(w http.ResponseWriter, r *http.Request, s *session) {
	id, _ := strconv.Atoi(r.FormValue("id"))
	c.mu.Lock()
	res := c.results[id]
	c.mu.Unlock()
	if res == nil {
		c.fail(w, r, s, http.StatusNotFound, "No such result: the console keeps the latest "+strconv.Itoa(maxResults)+".")
		return
	}
	c.render.page(w, http.StatusOK, "result", c.view(s, "Done", res))
}

func (c *Console) outboxPage(w http.ResponseWriter, r *http.Request, s *session) {
	if c.cfg.Outbox == nil {
		c.fail(w, r, s, http.StatusNotFound, "This console shows no outbox: start it with --dsn.")
		return
	}
	ctx := r.Context()
	page := struct {
		Table                  string
		Rows                   []outbox.Row
		Counted                bool
		InFlight, Sent, Failed int64
		Err                    string
	}{Table: c.cfg.Outbox.Table()}
	rows, err := c.cfg.Outbox.List(ctx, outbox.ListOptions{Failed: true, Limit: 500})
	if err == nil {
		page.Rows = rows
		var counts map[outbox.Status]int64
		if counts, err = c.cfg.Outbox.Counts(ctx); err == nil {
			page.Counted = true
			page.InFlight, page.Sent, page.Failed = counts[outbox.StatusInFlight], counts[outbox.StatusSent], counts[outbox.StatusFailed]
		}
	}
	if err != nil {
		page.Err = c.redact(err.Error())
	}
	c.render.page(w, http.StatusOK, "outbox", c.view(s, "Outbox", page))
}

func (c *Console) outboxRetry(w http.ResponseWriter, r *http.Request, s *session) {
	if c.cfg.Outbox == nil {
		c.fail(w, r, s, http.StatusNotFound, "This console shows no outbox: start it with --dsn.")
		return
	}
	actx, cancel := context.WithCancel(c.base())
	defer cancel()
	out := Outcome{Action: "outbox-retry", Left: -1, Depth: -1, Time: time.Now()}
	var entry AuditEntry
	if r.PostFormValue("all") == "yes" {
		n, err := c.cfg.Outbox.RetryAllFailed(actx)
		out.Done, out.Requested, out.Err = n, n, err
		entry = c.entry(r, s, out)
		entry.Messages = []string{"all failed rows of " + c.cfg.Outbox.Table()}
	} else {
		var ids []string
		for _, raw := range r.PostForm["id"] {
			id, err := strconv.ParseInt(raw, 10, 64)
			if err != nil || id < 1 {
				c.fail(w, r, s, http.StatusBadRequest, escape.Line(raw)+" is not a row id.")
				return
			}
			out.Requested++
			if err := c.cfg.Outbox.Retry(actx, id); err != nil {
				out.Err = errors.Join(out.Err, err)
				continue
			}
			out.Done++
			ids = append(ids, "row:"+raw)
		}
		entry = c.entry(r, s, out)
		entry.Messages = ids
	}
	c.finish(w, r, s, out, entry)
}
