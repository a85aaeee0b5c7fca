package console

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/escape"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticRoot embed.FS

// staticFiles is what /static/ serves: the style sheet.
var staticFiles, _ = fs.Sub(staticRoot, "static")

// pages are the templates, each rendered inside layout.html.
var pages = []string{"login", "signedin", "overview", "group", "message", "confirm", "result", "outbox", "search", "edit", "error"}

// renderer renders pages. Text from messages reaches a template as it is
// and goes through line, block or cut there, which escape it as the CLI
// does (control characters, bidi overrides, bytes that are not UTF-8 shown
// as \x1b, \u202e, \xff); html/template then escapes it for HTML.
type renderer struct {
	pages map[string]*template.Template
}

var funcs = template.FuncMap{
	"line":            escape.Line,
	"lines":           block,
	"hv":              escape.HeaderValue,
	"cut":             cut,
	"snip":            snip,
	"neg":             func(n int) int { return -n },
	"archive":         IsArchive,
	"when":            when,
	"num":             num,
	"messagesPerPage": func() int { return messagesPerPage },
	"hexDumpBytes":    func() int { return escape.MaxHexDump },
}

func newRenderer() (*renderer, error) {
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	r := &renderer{pages: make(map[string]*template.Template, len(pages))}
	for _, name := range pages {
		t, err := template.Must(layout.Clone()).ParseFS(templateFiles, "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		r.pages[name] = t
	}
	return r, nil
}

// page renders the named page with status. It renders into a buffer first,
// so a template error is a 500, not half a page.
func (r *renderer) page(w http.ResponseWriter, status int, name string, v view) {
	var b bytes.Buffer
	if err := r.pages[name].ExecuteTemplate(&b, "layout", v); err != nil {
		http.Error(w, "500 the page could not be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// block is s for a <pre>: escaped as escape.Block does, except that its tabs
// stay tabs, so a stack trace's indented lines show as the runtime wrote
// them (a tab is as harmless as a line break).
func block(s string) string {
	if !strings.Contains(s, "\t") {
		return escape.Block(s)
	}
	parts := strings.Split(s, "\t")
	for i, p := range parts {
		parts[i] = escape.Block(p)
	}
	return strings.Join(parts, "\t")
}

// cut is s for a table cell: its white-space runs made one space, cut to n
// characters (a byte that is not UTF-8 counting as one), escaped.
func cut(n int, s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return escape.Line(s)
	}
	end := 0
	for range n - 1 {
		_, size := utf8.DecodeRuneInString(s[end:])
		end += size
	}
	return escape.Line(s[:end]) + "…"
}

// snip is part of a search's snippet for a page: each run of white space
// one space (kept at its ends, where it meets the match), escaped.
func snip(s string) string {
	var b strings.Builder
	space := false
	for _, r := range s {
		if unicode.IsSpace(r) {
			space = true
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(r)
	}
	if space {
		b.WriteByte(' ')
	}
	return escape.Line(b.String())
}

// when is a time for a page, in UTC to the millisecond; "-" for none.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// num writes n with thousands separators: 10,000.
func num(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return "-" + num(-n)
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// headerView is one header on the message page.
type headerView struct {
	Name      string // escaped
	Value     string // escaped
	Multiline bool
}

func headersOf(h amqp.Table) []headerView {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	out := make([]headerView, 0, len(names))
	for _, k := range names {
		v := headerView{Name: escape.Line(k), Value: escape.HeaderValue(h[k])}
		if s, ok := h[k].(string); ok && strings.Contains(s, "\n") {
			v.Value, v.Multiline = block(s), true
		}
		out = append(out, v)
	}
	return out
}

// deathView is one x-death entry on the message page, escaped.
type deathView struct {
	Queue, Reason, Exchange, RoutingKeys string
	Count                                int
	Time                                 time.Time
}

func deathsOf(h amqp.Table) []deathView {
	deaths := amqphdr.Deaths(h)
	out := make([]deathView, len(deaths))
	for i, d := range deaths {
		keys := make([]string, len(d.RoutingKeys))
		for j, k := range d.RoutingKeys {
			keys[j] = escape.Line(k)
		}
		out[i] = deathView{Queue: escape.Line(d.Queue), Reason: escape.Line(d.Reason), Exchange: escape.Line(d.Exchange),
			RoutingKeys: strings.Join(keys, ", "), Count: d.Count, Time: d.Time}
	}
	return out
}

// CostNote says what a look costs on the broker the snapshot was taken
// from, which changed with RabbitMQ 4.3.
func CostNote(s *Snapshot) string {
	v := s.Version
	var note string
	switch {
	case v.AtLeast(4, 3):
		note = fmt.Sprintf("RabbitMQ %s does not count a look (a consumer's deliveries handed back at once with one basic.nack, requeue) toward a quorum queue's delivery limit, "+
			"so looking costs nothing but the redelivered mark; only a look cut off (the console killed, the connection lost) hands the messages back in a way that counts, "+
			"once for each message the broker had sent it (up to --limit).", v)
	case v.AtLeast(4, 0):
		note = fmt.Sprintf("On RabbitMQ %s each look (a consumer's deliveries handed back at once with basic.nack, requeue) counts once toward a quorum queue's delivery limit "+
			"(x-delivery-limit: 20 unless the queue sets one; a dlx.Topology DLQ sets 2,147,483,647): a message looked at past its limit is dropped or dead-lettered. "+
			"Classic queues count nothing; RabbitMQ 4.3 no longer counts a look.", v)
	case v.Known:
		note = fmt.Sprintf("On RabbitMQ %s a look (a consumer's deliveries handed back at once with basic.nack, requeue) marks each message redelivered; a quorum queue counts it in "+
			"x-delivery-count and, if the queue sets x-delivery-limit, drops or dead-letters a message past that limit. Classic queues count nothing.", v)
	default:
		note = "The broker did not say its version: on RabbitMQ 4.0 to 4.2 each look counts toward a quorum queue's delivery limit; from 4.3 it does not."
	}
	if s.MaxDeliveryCount > 0 {
		note += fmt.Sprintf(" The highest x-delivery-count in this look is %d.", s.MaxDeliveryCount)
	}
	return note
}
