package console

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// Bounds on a search.
const (
	maxQuery       = 200     // characters of a query
	maxHits        = 500     // matches a results page lists
	searchedBody   = 1 << 20 // bytes of a body searched
	snippetContext = 40      // characters shown either side of a match
)

// Hit is a message a search found, where, and the text around the match
// (raw: the page escapes it).
type Hit struct {
	Queue  string
	M      *Message
	Where  string // "message id", "correlation id", "header x-foo", "body"
	Before string
	Match  string
	After  string
}

// Search finds the messages of snap whose message id, correlation id, a
// header's value (or name) or body holds query, in any case, head first;
// at most limit of them, with how many there were in all.
func Search(snap *Snapshot, query string, limit int) (hits []Hit, total int) {
	if query == "" {
		return nil, 0
	}
	folded := strings.ToLower(query)
	for _, m := range snap.Messages {
		where, text, ok := matchMessage(m, folded)
		if !ok {
			continue
		}
		total++
		if len(hits) < limit {
			h := Hit{Queue: snap.Queue, M: m, Where: where}
			h.Before, h.Match, h.After = snippet(text, query)
			hits = append(hits, h)
		}
	}
	return hits, total
}

// matchMessage reports the first field of m that holds the query (folded:
// lower case), and that field's text.
func matchMessage(m *Message, folded string) (where, text string, ok bool) {
	d := &m.Delivery
	fields := []struct{ where, text string }{{"message id", d.MessageId}, {"correlation id", d.CorrelationId}}
	for _, f := range fields {
		if containsFold(f.text, folded) {
			return f.where, f.text, true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		v := headerText(d.Headers[k])
		if containsFold(v, folded) {
			return "header " + k, v, true
		}
		if containsFold(k, folded) {
			return "header " + k, k, true
		}
	}
	body := string(d.Body[:min(len(d.Body), searchedBody)])
	if containsFold(body, folded) {
		return "body", body, true
	}
	return "", "", false
}

// headerText is a header's value as a search reads it: a string as it is,
// anything else as fmt prints it (nested tables with their keys sorted).
func headerText(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case []byte:
		return string(v)
	}
	return fmt.Sprint(v)
}

func containsFold(s, folded string) bool {
	return strings.Contains(strings.ToLower(s), folded)
}

// snippet cuts s around the first match of query, in any case: up to
// snippetContext characters either side.
func snippet(s, query string) (before, match, after string) {
	i, n := indexFold(s, query)
	if i < 0 {
		return "", "", cutRunes(s, 2*snippetContext)
	}
	start := i
	for k := 0; k < snippetContext && start > 0; k++ {
		_, size := utf8.DecodeLastRuneInString(s[:start])
		start -= size
	}
	before = s[start:i]
	if start > 0 {
		before = "…" + before
	}
	match = s[i : i+n]
	rest := s[i+n:]
	after = cutRunes(rest, snippetContext)
	return before, match, after
}

// cutRunes is s cut to n characters, with … when it was longer.
func cutRunes(s string, n int) string {
	end := 0
	for k := 0; k < n && end < len(s); k++ {
		_, size := utf8.DecodeRuneInString(s[end:])
		end += size
	}
	if end < len(s) {
		return s[:end] + "…"
	}
	return s
}

// indexFold is the byte offset of the first match of sub in s in any case
// (simple Unicode folding), and the match's length in s; -1 if none.
func indexFold(s, sub string) (int, int) {
	for i := 0; i < len(s); {
		if n, ok := prefixFold(s[i:], sub); ok {
			return i, n
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return -1, 0
}

// prefixFold reports whether s starts with sub in any case, and how many
// bytes of s that takes.
func prefixFold(s, sub string) (int, bool) {
	i := 0
	for _, r := range sub {
		if i >= len(s) {
			return 0, false
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c != r && !strings.EqualFold(string(c), string(r)) {
			return 0, false
		}
		i += size
	}
	return i, true
}
