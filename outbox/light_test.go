package outbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Importing the consumer side of the library pulls in no database code: the
// outbox's driver lives in this module's go.mod, not the core's.
func TestCoreImportsNoDatabase(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./middleware", "./listener", "./recoverer", "./publisher", "./dlx")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list in the core module: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "database/sql" || strings.Contains(dep, "jackc/") || strings.Contains(dep, "lib/pq") {
			t.Errorf("the core's consumer packages depend on %s", dep)
		}
	}
}
