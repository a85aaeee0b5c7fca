package clustertest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// URLsEnv names the variable holding the cluster's comma-separated AMQP URLs,
// in node order (what `scripts/cluster.sh urls` prints).
const URLsEnv = "AMQPRETRY_CLUSTER_URLS"

// RequireEnv is the variable that turns a missing cluster into a failure.
const RequireEnv = "AMQPRETRY_REQUIRE_CLUSTER"

// ScriptEnv names the variable that overrides where cluster.sh is; by default
// it is scripts/cluster.sh in the module that holds the test.
const ScriptEnv = "AMQPRETRY_CLUSTER_SCRIPT"

// Nodes are the cluster's node names as the script takes them; URLs()[i]
// reaches Nodes[i].
var Nodes = []string{"n1", "n2", "n3"}

// URLs returns the URLs in $AMQPRETRY_CLUSTER_URLS, or nil when it is unset.
func URLs() []string {
	var urls []string
	for _, u := range strings.Split(os.Getenv(URLsEnv), ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	return urls
}

// Required reports whether cluster tests must fail rather than skip without
// a cluster.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Require returns the cluster's URLs, one per node. Without them it fails the
// test when Required and skips it otherwise.
func Require(t testing.TB) []string {
	t.Helper()
	urls := URLs()
	switch {
	case len(urls) == 0:
		msg := "no cluster: $" + URLsEnv + " is not set (make test-cluster starts one and sets it)"
		if Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	case len(urls) != len(Nodes):
		t.Fatalf("$%s has %d URLs; the cluster has %d nodes", URLsEnv, len(urls), len(Nodes))
	}
	return urls
}

// URL returns the URL of a node by name ("n2").
func URL(t testing.TB, node string) string {
	t.Helper()
	urls := Require(t)
	for i, n := range Nodes {
		if n == node {
			return urls[i]
		}
	}
	t.Fatalf("no node %q: the nodes are %v", node, Nodes)
	return ""
}

// Script returns the path of cluster.sh: $AMQPRETRY_CLUSTER_SCRIPT, or
// scripts/cluster.sh in the nearest directory above the working directory
// (a test's is its package's) that has one.
func Script() (string, error) {
	if s := os.Getenv(ScriptEnv); s != "" {
		return s, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		s := filepath.Join(dir, "scripts", "cluster.sh")
		if _, err := os.Stat(s); err == nil {
			return s, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("clustertest: no scripts/cluster.sh above the working directory; set $" + ScriptEnv)
		}
		dir = parent
	}
}

// script runs cluster.sh with args and returns its standard output; its
// standard error (the script's progress) goes into the error when it fails.
func script(args ...string) (string, error) {
	s, err := Script()
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(s, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("cluster.sh %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// restorers remembers, per test, that its cleanup is registered, so a test
// that disrupts many times restores once.
var restorers sync.Map // testing.TB -> *restorer

type restorer struct {
	mu          sync.Mutex
	killed      map[string]bool
	partitioned map[string]bool
}

// Run runs scripts/cluster.sh with args ("kill", "n1"; "status"; ...) and
// returns its standard output, failing the test if it fails. After "kill" or
// "partition" the test's cleanup restores the node (heal, then start) and
// waits until the cluster is whole again, whatever the test's outcome.
func Run(t testing.TB, args ...string) string {
	t.Helper()
	if len(args) == 2 && (args[0] == "kill" || args[0] == "partition") {
		r := restorerFor(t)
		r.mu.Lock()
		if args[0] == "kill" {
			r.killed[args[1]] = true
		} else {
			r.partitioned[args[1]] = true
		}
		r.mu.Unlock()
	}
	out, err := script(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func restorerFor(t testing.TB) *restorer {
	r := &restorer{killed: map[string]bool{}, partitioned: map[string]bool{}}
	if old, loaded := restorers.LoadOrStore(t, r); loaded {
		return old.(*restorer)
	}
	t.Cleanup(func() {
		restorers.Delete(t)
		r.restore(t)
	})
	return r
}

// restore heals before it starts: a killed node that is also cut off would
// boot waiting for peers it cannot reach. up then waits for three running
// members (and heals and starts whatever else is down).
func (r *restorer) restore(t testing.TB) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var steps [][]string
	for _, n := range Nodes {
		if r.partitioned[n] {
			steps = append(steps, []string{"heal", n})
		}
	}
	for _, n := range Nodes {
		if r.killed[n] {
			steps = append(steps, []string{"start", n})
		}
	}
	steps = append(steps, []string{"up"})
	for _, s := range steps {
		if _, err := script(s...); err != nil {
			t.Errorf("restoring the cluster: %v", err)
			return
		}
	}
}

// Leader returns the node ("n1") that leads a quorum queue, asking the nodes
// in turn until one answers (a killed or cut-off node does not), or "" when
// the nodes that answer know no leader, as during an election.
func Leader(t testing.TB, queue string) string {
	t.Helper()
	var errs []error
	for _, n := range Nodes {
		out, err := script("ctl", n, "-q", "-t", "10", "list_queues", "--no-table-headers", "name", "leader")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			name, leader, ok := strings.Cut(strings.TrimRight(line, "\r"), "\t")
			if ok && name == queue {
				return nodeOf(strings.TrimSpace(leader))
			}
		}
		t.Fatalf("node %s lists no queue %s:\n%s", n, queue, out)
	}
	t.Fatalf("no node answers list_queues: %v", errors.Join(errs...))
	return ""
}

// nodeOf maps a node name ("rabbit@amqpretry-n2") to the script's ("n2").
func nodeOf(name string) string {
	_, host, ok := strings.Cut(name, "@")
	if !ok {
		return name
	}
	return strings.TrimPrefix(host, "amqpretry-")
}
