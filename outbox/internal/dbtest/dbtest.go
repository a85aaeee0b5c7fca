// Package dbtest gives tests a PostgreSQL database: a connection to
// $DATABASE_URL and a schema of their own, dropped when the test ends.
// Without a database a test is skipped, or fails when
// AMQPRETRY_REQUIRE_DB=1 (make test sets it).
package dbtest

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/amqpretry/amqpretry/outbox/internal/pgsql"
)

// RequireEnv is the variable that turns a missing database into a failure.
const RequireEnv = "AMQPRETRY_REQUIRE_DB"

// Default is the database scripts/postgres.sh provides.
const Default = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL is $DATABASE_URL, or Default.
func URL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return Default
}

// Addr is the host:port of URL(), where a fault proxy forwards.
func Addr(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(URL())
	if err != nil {
		t.Fatalf("$DATABASE_URL %s does not parse as a URL: %v", pgsql.Redact(URL()), err)
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// WithHost returns URL() with another host:port and the given password, so
// a test can reach the database through a proxy and prove the password is
// never shown. (Trust authentication ignores the password.)
func WithHost(t testing.TB, hostport, password string) string {
	t.Helper()
	u, err := url.Parse(URL())
	if err != nil {
		t.Fatalf("$DATABASE_URL %s does not parse as a URL: %v", pgsql.Redact(URL()), err)
	}
	u.Host = hostport
	user := "postgres"
	if u.User != nil {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// Open connects to dsn and closes the pool when the test ends. Without a
// database it fails the test under make test and skips it otherwise.
func Open(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err == nil {
		err = db.Ping()
		if err != nil {
			_ = db.Close()
		}
	}
	if err != nil {
		msg := fmt.Sprintf("no PostgreSQL at %s: %v (run scripts/postgres.sh to start one)", pgsql.Redact(dsn), pgsql.Redact(err.Error()))
		if os.Getenv(RequireEnv) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// OpenLazy opens dsn without checking that it answers, for tests of a
// database that is down.
func OpenLazy(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("sql.Open: %v", pgsql.Redact(err.Error()))
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// DB connects to URL().
func DB(t testing.TB) *sql.DB {
	t.Helper()
	return Open(t, URL())
}

// Schema creates a schema unique to this test and drops it, with all it
// holds, when the test ends.
func Schema(t testing.TB, db *sql.DB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "amqpretry_test_" + hex.EncodeToString(b[:])
	if _, err := db.Exec(`CREATE SCHEMA ` + name); err != nil {
		t.Fatalf("create schema %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec(`DROP SCHEMA ` + name + ` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}
