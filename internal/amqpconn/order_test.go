package amqpconn

import (
	"slices"
	"strings"
	"testing"
)

// Each dial shuffles the addresses unless InOrder, so that clients spread
// over a cluster's nodes; the address reached before always goes last.
func TestOrder(t *testing.T) {
	urls := []string{"a", "b", "c"}
	seen := map[string]int{}
	for range 600 {
		got := Config{URLs: urls}.order("")
		if len(got) != 3 || !slices.Contains(got, "a") || !slices.Contains(got, "b") || !slices.Contains(got, "c") {
			t.Fatalf("order = %v, want a permutation of %v", got, urls)
		}
		seen[strings.Join(got, "")]++
	}
	if len(seen) != 6 {
		t.Errorf("600 shuffles gave %d of the 6 orders: %v", len(seen), seen)
	}
	for order, n := range seen {
		if n < 50 { // 100 expected; below 50 is beyond chance
			t.Errorf("order %s came %d times in 600", order, n)
		}
	}
	if !slices.Equal(urls, []string{"a", "b", "c"}) {
		t.Errorf("order changed the Config's URLs: %v", urls)
	}
	for _, tt := range []struct {
		inOrder bool
		last    string
	}{{true, ""}, {true, "a"}, {true, "b"}, {true, "zzz"}, {false, "a"}, {false, "c"}} {
		for range 50 {
			got := Config{URLs: urls, InOrder: tt.inOrder}.order(tt.last)
			if slices.Contains(urls, tt.last) && got[2] != tt.last {
				t.Fatalf("order(InOrder %v, last %q) = %v, want %q last", tt.inOrder, tt.last, got, tt.last)
			}
			if tt.inOrder {
				want := slices.DeleteFunc(slices.Clone(urls), func(u string) bool { return u == tt.last })
				if slices.Contains(urls, tt.last) {
					want = append(want, tt.last)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("order(InOrder, last %q) = %v, want %v", tt.last, got, want)
				}
			}
		}
	}
	if got := (Config{URLs: []string{"a"}}).order("a"); !slices.Equal(got, []string{"a"}) {
		t.Errorf("one address: order = %v", got)
	}
}
