package main

import (
	"flag"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/console"
	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/deadletter"
	"github.com/amqpretry/amqpretry/recoverer"
)

// matchedBody is how much of a body --match reads.
const matchedBody = 4096

// selection is which dead letters a dlq command works on: those --match,
// --error-type and --id select (every one when none is given).
type selection struct {
	match     *regexp.Regexp
	matchText string // as typed, for messages
	errorType string
	id        string
	idSet     bool
	key       string // console.Key's: id:..., fp:...
	prefix    string // the recoverer's header prefix
}

// selectionFlags are the flags that make a selection.
type selectionFlags struct {
	match, errorType *string
	caseSensitive    *bool
}

func addSelectionFlags(fs *flag.FlagSet) selectionFlags {
	return selectionFlags{
		match:         fs.String("match", "", "only messages where this `REGEXP` matches the message id, original routing key, exception, a header (name: value) or the body's first 4 KiB; any case unless --case-sensitive"),
		errorType:     fs.String("error-type", "", "only messages whose error type (the recoverer's error-type header, error_type in list's JSON) is this `TYPE`, in any case"),
		caseSensitive: fs.Bool("case-sensitive", false, "--match tells upper from lower case"),
	}
}

// selection compiles the flags; a --match that is not a regular expression
// is a usage error.
func (f selectionFlags) selection(prefix string) (selection, error) {
	s := selection{matchText: *f.match, errorType: *f.errorType, prefix: prefix}
	if *f.match != "" {
		expr := *f.match
		if !*f.caseSensitive {
			expr = "(?i)" + expr
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return s, usagef("--match: %v", err)
		}
		s.match = re
	}
	return s, nil
}

// filters says whether the selection leaves any message out.
func (s selection) filters() bool {
	return s.match != nil || s.errorType != "" || s.idSet || s.key != ""
}

func (s selection) selects(d *amqp.Delivery) bool {
	if s.idSet && d.MessageId != s.id {
		return false
	}
	if s.key != "" && console.Key(d) != s.key {
		return false
	}
	if s.errorType != "" && !strings.EqualFold(header(d, s.prefix+recoverer.SuffixErrorType), s.errorType) {
		return false
	}
	return s.match == nil || s.matches(d)
}

func (s selection) matches(d *amqp.Delivery) bool {
	re := s.match
	if re.MatchString(d.MessageId) || re.MatchString(originalKey(d)) || re.MatchString(deadletter.Exception(d)) ||
		re.Match(d.Body[:min(len(d.Body), matchedBody)]) {
		return true
	}
	for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
		if re.MatchString(k + ": " + header(d, k)) {
			return true
		}
	}
	return false
}

// noneSelected is the error for a selection that selected nothing of the
// seen messages looked at on queue.
func (s selection) noneSelected(queue string, seen int) error {
	var what []string
	if s.idSet {
		what = append(what, fmt.Sprintf("with id %q", s.id))
	}
	if s.key != "" {
		what = append(what, fmt.Sprintf("with key %q", s.key))
	}
	if s.match != nil {
		how := "in any case"
		if !strings.HasPrefix(s.match.String(), "(?i)") {
			how = "case-sensitive"
		}
		what = append(what, fmt.Sprintf("matching --match %q (%s, over the id, original routing key, exception, headers and body)", s.matchText, how))
	}
	if s.errorType != "" {
		what = append(what, fmt.Sprintf("with --error-type %q", s.errorType))
	}
	return fmt.Errorf("no message %s on %s, of %d looked at (amqpretry dlq summary %s shows the causes and error types there are)",
		strings.Join(what, " and "), queue, seen, queue)
}
