package inbox_test

import (
	"context"
	"testing"
	"time"
)

// Defect 2 of issue 35: Migrate on an up-to-date inbox table queued every
// handler behind the longest open one. CREATE INDEX IF NOT EXISTS takes the
// table's SHARE lock even when the index exists, and waited for it with no
// lock_timeout: a handler's transaction open when a consumer started made
// every other handler wait until it ended. Migrate now skips what exists
// and bounds every lock it takes.
func TestMigrateOfAnUpToDateTableQueuesNoHandler(t *testing.T) {
	ib, db, schema := setup(t)
	table := schema + ".inbox"
	ctx := context.Background()
	// A handler's transaction, open: it holds the table's ROW EXCLUSIVE lock.
	open, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback() }()
	if _, err := open.Exec(`INSERT INTO `+table+` (consumer, message_id) VALUES ('billing', $1)`, "slow"); err != nil {
		t.Fatal(err)
	}

	migrated := make(chan error, 1)
	go func() { migrated <- ib.Migrate(ctx) }()
	var migrateErr error
	done := false
	deadline := time.Now().Add(10 * time.Second)
	for !done {
		select {
		case migrateErr = <-migrated:
			done = true
			continue
		default:
		}
		var waiting int
		if err := db.QueryRow(`SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND NOT granted`, table).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Migrate neither returned nor waited for a lock within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Another handler records its message while the first is still open.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := db.ExecContext(wctx, `INSERT INTO `+table+` (consumer, message_id) VALUES ('billing', $1)`, "next"); err != nil {
		t.Fatalf("a handler waited behind Migrate, which waited behind an open handler: %v", err)
	}
	_ = open.Rollback()
	if !done {
		migrateErr = <-migrated
	}
	if migrateErr != nil {
		t.Fatalf("Migrate of an up-to-date table: %v", migrateErr)
	}
}
