//go:build disruptive || cluster

package reliability

import (
	"hash/fnv"
	"os"
	"strconv"
)

// What a message does to its handler, decided by a hash of its id so that
// every delivery of it behaves the same.
type fate int

const (
	healthy   fate = iota
	transient      // fails its first attempt of each delivery: retried, then handled
	permanent      // fails with Permanent: straight to the DLQ
	panics         // panics on every attempt: retried, then to the DLQ
)

func fateOf(id string) fate {
	h := fnv.New32a()
	h.Write([]byte(id))
	switch n := h.Sum32() % 1000; {
	case n < 200:
		return transient // ~20%
	case n < 210:
		return permanent // ~1%
	case n < 215:
		return panics // ~0.5%
	}
	return healthy
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
