package main

import (
	"slices"
	"strings"
	"testing"
)

func TestBatchNamesAreSkippable(t *testing.T) {
	names := batchVariantNames()
	skip, err := parseSkip(strings.Join(append(names, sectionBatch), ","))
	if err != nil {
		t.Fatal(err)
	}
	if len(skip) != len(names)+1 {
		t.Errorf("parsed %v", skip)
	}
	others := append(append(slices.Clone(sections), variantNames()...), retryVariantNames()...)
	for _, name := range names {
		if slices.Contains(others, name) {
			t.Errorf("%q names both a batch variant and another section or variant: -skip would leave out both", name)
		}
	}
}

func TestInsertRows(t *testing.T) {
	if got, want := insertRows("s.t", 3), "INSERT INTO s.t (body) VALUES ($1),($2),($3)"; got != want {
		t.Errorf("insertRows = %q, want %q", got, want)
	}
}

func TestTallyHitN(t *testing.T) {
	tl := newTally(250)
	tl.hitN(100)
	tl.hitN(100)
	select {
	case <-tl.done:
		t.Fatal("done at 200 of 250")
	default:
	}
	tl.hitN(100) // past the target: done once
	tl.hitN(100)
	select {
	case <-tl.done:
	default:
		t.Fatal("not done at 300 of 250")
	}
}

// The per-message variant runs on a fifth of the section's messages, the
// others on all of them, and none on fewer than one.
func TestBatchVariantsShareOfMessages(t *testing.T) {
	for _, v := range (&batchBench{}).all(2, 250) {
		want := 100000
		if v.name == "per-message" {
			want = 20000
		}
		if got := v.messages(100000); got != want {
			t.Errorf("%s runs on %d of 100000 messages, want %d", v.name, got, want)
		}
		if got := v.messages(3); got < 1 {
			t.Errorf("%s runs on %d of 3 messages, want at least 1", v.name, got)
		}
	}
}
