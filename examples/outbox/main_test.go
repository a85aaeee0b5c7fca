package main

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/examples/internal/exampleutil"
)

// TestMain is also the relay process's entry: the example starts its own
// executable as the relay, and under go test that is this test binary.
func TestMain(m *testing.M) {
	if os.Getenv(relayEnv) != "" {
		os.Exit(relayMain())
	}
	goleak.VerifyTestMain(m)
}

// requireDB skips without PostgreSQL, or fails under AMQPRETRY_REQUIRE_DB=1
// (make test).
func requireDB(t *testing.T) {
	t.Helper()
	db, err := sql.Open("pgx", dsn())
	if err == nil {
		err = db.Ping()
		_ = db.Close()
	}
	if err != nil {
		if os.Getenv("AMQPRETRY_REQUIRE_DB") == "1" {
			t.Fatalf("no PostgreSQL: %v", err)
		}
		t.Skipf("no PostgreSQL: %v (run scripts/postgres.sh)", err)
	}
}

func TestOutbox(t *testing.T) {
	requireDB(t)
	var out bytes.Buffer
	if err := run(context.Background(), &out, exampleutil.URL(), dsn(), 200); err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	s := out.String()
	for _, want := range []string{
		"placed orders 1-100: 90 committed with their message, 10 declined and rolled back",
		"relay process SIGKILLed",
		"placed orders 101-200 with no relay running",
		"orders committed: 180 (and 20 declined, rolled back: no message for them)",
		"shipments: 180 for 180 orders; declined orders shipped: 0",
		"every committed order shipped exactly once",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(s)
	}
}
