package handoff

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestTakeReturnsWhatWasPutInOrderAtMostMax(t *testing.T) {
	tests := []struct {
		put, max int
		want     [][]int
	}{
		{put: 3, max: 10, want: [][]int{{0, 1, 2}}},
		{put: 5, max: 2, want: [][]int{{0, 1}, {2, 3}, {4}}},
		{put: 2, max: 1, want: [][]int{{0}, {1}}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("put %d, max %d", tt.put, tt.max), func(t *testing.T) {
			q := New[int]()
			for i := range tt.put {
				q.Put(i)
			}
			q.Close()
			var got [][]int
			for {
				batch := q.Take(nil, tt.max)
				if len(batch) == 0 {
					break
				}
				got = append(got, batch)
			}
			if !slices.EqualFunc(got, tt.want, slices.Equal) {
				t.Errorf("took %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTakeAppendsToWhatItIsGiven(t *testing.T) {
	q := New[string]()
	q.Put("b")
	if got := q.Take([]string{"a"}, 10); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("took %v, want [a b]", got)
	}
}

// Take waits for a Put, and for a Close, on an empty queue.
func TestTakeWaitsUntilPutOrClose(t *testing.T) {
	q := New[int]()
	took := make(chan []int)
	go func() { took <- q.Take(nil, 10) }()
	select {
	case got := <-took:
		t.Fatalf("Take returned %v from an empty, open queue", got)
	case <-time.After(20 * time.Millisecond):
	}
	q.Put(7)
	if got := <-took; !slices.Equal(got, []int{7}) {
		t.Fatalf("took %v, want [7]", got)
	}
	go func() { took <- q.Take(nil, 10) }()
	q.Close()
	if got := <-took; len(got) != 0 {
		t.Fatalf("took %v from a closed, empty queue", got)
	}
}

// Many putters, one taker: everything put is taken once, each putter's
// values in its order, and nobody waits to put.
func TestManyPuttersOneTaker(t *testing.T) {
	const putters, each = 8, 5000
	q := New[[2]int]()
	var wg sync.WaitGroup
	for p := range putters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				q.Put([2]int{p, i})
			}
		}()
	}
	go func() { wg.Wait(); q.Close() }()
	next := make([]int, putters)
	var batch [][2]int
	for {
		batch = q.Take(batch[:0], 100)
		if len(batch) == 0 {
			break
		}
		for _, v := range batch {
			if v[1] != next[v[0]] {
				t.Fatalf("putter %d: took %d, want %d", v[0], v[1], next[v[0]])
			}
			next[v[0]]++
		}
	}
	for p, n := range next {
		if n != each {
			t.Errorf("putter %d: took %d of %d", p, n, each)
		}
	}
}

// What was taken is not kept by the queue: its slots are cleared.
func TestTakenValuesAreNotRetained(t *testing.T) {
	q := New[*int]()
	for range 4 {
		q.Put(new(int))
	}
	q.Take(nil, 3)
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) != 1 {
		t.Fatalf("%d left, want 1", len(q.items))
	}
	for i, p := range q.items[len(q.items):cap(q.items)] {
		if p != nil {
			t.Errorf("slot %d past the end still holds a taken value", i+1)
		}
	}
}
