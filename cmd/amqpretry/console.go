package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/console"
	"github.com/amqpretry/amqpretry/internal/amqpurl"
	"github.com/amqpretry/amqpretry/outbox"
)

// stringList is a flag that may be given more than once.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// defaultAuditLog is where the console appends its audit lines unless
// --audit-log says otherwise.
const defaultAuditLog = "amqpretry-console-audit.jsonl"

const consoleUsage = `amqpretry console --queue DLQ [--queue DLQ...] | --queues-matching REGEXP [--listen ADDR] [--read-only] [--tokens FILE] [--dsn DSN] [flags]

Serves a web page over dead-letter queues: their dead letters grouped by
original queue, error type and exception message (numbers, UUIDs and hex ids
collapsed), or by stack, each group with a chart of its failures over time;
a group's messages; one message in full; a search over them all. From it,
replay a message, the ticked ones or a group to their queue, their original
exchange or another queue, edit one message and replay it, delete them, or
purge a queue (typing its name); each through dlx.Replay, confirmed before it
leaves the DLQ. With --dsn it shows the outbox's failed rows too, with their
retry.

A look reads at most --limit messages with a consumer and hands them all
back at once with one basic.nack(multiple, requeue). The page listens on
127.0.0.1:8080 and needs a token: a random one is printed at start, with the
address that signs in with it; a --listen beyond this machine needs --tokens.
Every action is a line of --audit-log. docs/console.md tells the rest.`

// runConsole runs "console": the web console (package console) until ctx
// ends.
func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("console")
	broker := addBrokerFlags(fs, true)
	var queues, hosts stringList
	fs.Var(&queues, "queue", "a dead-letter `QUEUE` to show (repeatable)")
	matching := fs.String("queues-matching", "", "also show every queue whose name matches this `REGEXP` (listed through the management API)")
	management := fs.String("management", "", "the management API's `URL`, for --queues-matching (default http://HOST:15672/ of --url, with its user)")
	listen := fs.String("listen", "127.0.0.1:8080", "serve on this `ADDRESS`")
	limit := fs.Int("limit", console.DefaultLimit, "a look takes at most `N` messages of a queue")
	readOnly := fs.Bool("read-only", false, "show, never change: no replay, delete, purge or retry")
	tokensFile := fs.String("tokens", "", "a `FILE` of NAME TOKEN lines, the tokens that sign in (default: one random token, printed)")
	tokenName := fs.String("token-name", "operator", "the `NAME` the audit log gives the printed token")
	fs.Var(&hosts, "host", "a further host `NAME` the console is reached as (repeatable)")
	auditPath := fs.String("audit-log", defaultAuditLog, "the `FILE` audit lines are appended to (- for standard error)")
	dsn := fs.String("dsn", "", "show the failed rows of the outbox in this PostgreSQL `DSN`")
	table := fs.String("table", outbox.DefaultTable, "with --dsn: the outbox table, `NAME` or SCHEMA.NAME")
	certFile := fs.String("tls-cert", "", "serve HTTPS with this certificate `FILE` (PEM), with --tls-key")
	keyFile := fs.String("tls-key", "", "the key `FILE` of --tls-cert (PEM)")
	archiveType := addArchiveTypeFlag(fs)
	positional, err := parseAll(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 0 {
		return usagef("console takes no arguments (give queues with --queue), got %q", positional)
	}
	if len(queues) == 0 && *matching == "" {
		return usagef("console needs --queue DLQ (repeatable) or --queues-matching REGEXP")
	}
	if *limit < 1 {
		return usagef("--limit expects 1 or more, got %d", *limit)
	}
	if (*certFile == "") != (*keyFile == "") {
		return usagef("--tls-cert and --tls-key go together")
	}
	cfg := console.Config{Queues: queues, ManagementURL: *management, Limit: *limit, HeaderPrefix: *broker.prefix, ArchiveType: *archiveType,
		ReadOnly: *readOnly, Hosts: hosts, SecureCookie: *certFile != ""}
	if *matching != "" {
		if cfg.QueuesMatching, err = regexp.Compile(*matching); err != nil {
			return usagef("--queues-matching: %v", err)
		}
	}
	if cfg.URLs, err = broker.urls(); err != nil {
		return err
	}

	addr, err := net.ResolveTCPAddr("tcp", *listen)
	if err != nil {
		return usagef("--listen %s: %v", *listen, err)
	}
	printed := ""
	if *tokensFile != "" {
		if cfg.Tokens, err = readTokens(*tokensFile); err != nil {
			return err
		}
	} else {
		if addr.IP == nil || !addr.IP.IsLoopback() {
			return usagef("--listen %s is not a loopback address: give --tokens FILE (a NAME TOKEN line per person, "+
				"each token %d characters or more), so that only the holder of a token gets in", *listen, console.MinTokenLength)
		}
		printed = console.NewToken()
		cfg.Tokens = map[string]string{*tokenName: printed}
	}

	audit, closeAudit, err := openAudit(*auditPath, stderr)
	if err != nil {
		return err
	}
	defer closeAudit()
	cfg.Audit = audit
	cfg.Log = slog.New(slog.NewTextHandler(stderr, nil))

	if *dsn != "" {
		db, err := openDB(*dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		if cfg.Outbox, err = outbox.New(db, outbox.WithTable(*table)); err != nil {
			return usagef("--table: %v", err)
		}
		if pc, err := pgx.ParseConfig(*dsn); err == nil && pc.Password != "" {
			cfg.Secrets = append(cfg.Secrets, pc.Password)
		}
	}

	c, err := console.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	scheme := "http"
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("console: --tls-cert, --tls-key: %w", err)
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		scheme = "https"
	}
	at := scheme + "://" + ln.Addr().String() + "/"
	fmt.Fprintf(stdout, "amqpretry console: %d queue(s)%s on %s, at %s%s\n", len(queues), matchingNote(*matching),
		amqpurl.Redact(strings.Join(cfg.URLs, ",")), at, readOnlyNote(*readOnly))
	if printed != "" {
		fmt.Fprintf(stdout, "sign in (token %q): %slogin?token=%s\n", *tokenName, at, printed)
	} else {
		fmt.Fprintf(stdout, "sign in with a token of %s at %slogin\n", *tokensFile, at)
	}
	fmt.Fprintf(stdout, "audit log: %s\n", auditName(*auditPath))
	if !addr.IP.IsLoopback() && *certFile == "" {
		fmt.Fprintln(stderr, "amqpretry console: warning: serving plain HTTP beyond this machine: tokens and cookies cross the network in clear; give --tls-cert and --tls-key, or put a TLS proxy in front (and --host its name)")
	}
	return c.Serve(ctx, ln)
}

// readTokens reads a tokens file: a "NAME TOKEN" line per token, blank
// lines and lines starting with # ignored. Its errors never quote a token.
func readTokens(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usagef("--tokens: %v", err)
	}
	defer f.Close()
	tokens := map[string]string{}
	scanner := bufio.NewScanner(f)
	for n := 1; scanner.Scan(); n++ {
		line := strings.TrimSpace(scanner.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		switch {
		case len(fields) != 2:
			return nil, usagef("--tokens %s, line %d: want NAME TOKEN", path, n)
		case len(fields[1]) < console.MinTokenLength:
			return nil, usagef("--tokens %s, line %d: the token of %q is shorter than %d characters", path, n, fields[0], console.MinTokenLength)
		case tokens[fields[0]] != "":
			return nil, usagef("--tokens %s, line %d: %q is named twice", path, n, fields[0])
		}
		tokens[fields[0]] = fields[1]
	}
	if err := scanner.Err(); err != nil {
		return nil, fmt.Errorf("--tokens %s: %w", path, err)
	}
	if len(tokens) == 0 {
		return nil, usagef("--tokens %s holds no token", path)
	}
	return tokens, nil
}

// openAudit opens the audit log for appending, readable by its owner only.
func openAudit(path string, stderr io.Writer) (io.Writer, func(), error) {
	if path == "-" {
		return stderr, func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("--audit-log: %w", err)
	}
	return f, func() {
		if err := f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			fmt.Fprintf(stderr, "amqpretry console: closing the audit log: %v\n", err)
		}
	}, nil
}

func auditName(path string) string {
	if path == "-" {
		return "standard error"
	}
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

func matchingNote(re string) string {
	if re == "" {
		return ""
	}
	return fmt.Sprintf(" and every queue matching %q", re)
}

func readOnlyNote(readOnly bool) string {
	if readOnly {
		return " (read-only)"
	}
	return ""
}
