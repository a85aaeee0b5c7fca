package console

import (
	"slices"
	"testing"
	"time"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestNewSpan(t *testing.T) {
	for _, tt := range []struct {
		name        string
		first, now  string
		max         int
		wantFrom    string
		wantStep    time.Duration
		wantBuckets int
	}{
		{"an hour in 5 min steps", "2026-03-01T11:02:00Z", "2026-03-01T12:00:30Z", 24, "2026-03-01T11:00:00Z", 5 * time.Minute, 13},
		{"a burst of seconds: minutes, back to half the buckets", "2026-03-01T12:00:28Z", "2026-03-01T12:00:30Z", 24, "2026-03-01T11:49:00Z", time.Minute, 12},
		{"two days in 2 h steps", "2026-03-01T00:10:00Z", "2026-03-02T23:50:00Z", 24, "2026-03-01T00:00:00Z", 2 * time.Hour, 24},
		{"a day and a minute is 25 hours: 2 h steps", "2026-03-01T00:00:00Z", "2026-03-02T00:01:00Z", 24, "2026-03-01T00:00:00Z", 2 * time.Hour, 13},
		{"no failure time: half the buckets of minutes", "0001-01-01T00:00:00Z", "2026-03-01T12:00:30Z", 24, "2026-03-01T11:49:00Z", time.Minute, 12},
		{"a failure in the future counts as now", "2026-03-01T13:00:00Z", "2026-03-01T12:00:30Z", 24, "2026-03-01T11:49:00Z", time.Minute, 12},
		{"a year is cut to the most buckets of 28 days", "2025-01-01T00:00:00Z", "2026-03-01T00:00:00Z", 10, "", 28 * 24 * time.Hour, 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSpan(at(tt.first), at(tt.now), tt.max)
			if s.Step != tt.wantStep || s.Buckets != tt.wantBuckets || (tt.wantFrom != "" && !s.From.Equal(at(tt.wantFrom))) {
				t.Errorf("NewSpan = from %s, step %v, %d buckets; want from %s, step %v, %d buckets",
					s.From.UTC().Format(time.RFC3339), s.Step, s.Buckets, tt.wantFrom, tt.wantStep, tt.wantBuckets)
			}
			if now := at(tt.now); now.Before(s.To().Add(-s.Step)) || !now.Before(s.To()) {
				t.Errorf("the last bucket %s–%s does not hold the snapshot %s", s.To().Add(-s.Step), s.To(), now)
			}
		})
	}
}

func TestSpanCount(t *testing.T) {
	s := Span{From: at("2026-03-01T11:00:00Z"), Step: 10 * time.Minute, Buckets: 6, Now: at("2026-03-01T11:55:00Z")}
	for _, tt := range []struct {
		name  string
		times []string
		want  []int
	}{
		{"none", nil, []int{0, 0, 0, 0, 0, 0}},
		{"on the edges", []string{"2026-03-01T11:00:00Z", "2026-03-01T11:09:59.999Z", "2026-03-01T11:10:00Z", "2026-03-01T11:59:59Z"}, []int{2, 1, 0, 0, 0, 1}},
		{"before the span: the first bucket", []string{"2026-03-01T09:00:00Z"}, []int{1, 0, 0, 0, 0, 0}},
		{"after it (a clock ahead): the last", []string{"2026-03-01T14:00:00Z"}, []int{0, 0, 0, 0, 0, 1}},
		{"no time is not counted", []string{"0001-01-01T00:00:00Z", "2026-03-01T11:31:00Z"}, []int{0, 0, 0, 1, 0, 0}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var times []time.Time
			for _, x := range tt.times {
				times = append(times, at(x))
			}
			if got := s.Count(times); !slices.Equal(got, tt.want) {
				t.Errorf("Count = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestActivity(t *testing.T) {
	s := Span{From: at("2026-03-01T11:00:00Z"), Step: 10 * time.Minute, Buckets: 6, Now: at("2026-03-01T11:55:00Z")}
	for _, tt := range []struct {
		name   string
		counts []int
		last   string
		want   string
	}{
		{"the last bucket has failures", []int{0, 0, 0, 0, 0, 2}, "2026-03-01T11:51:00Z", "failing now"},
		{"stopped within the span", []int{3, 1, 0, 0, 0, 0}, "2026-03-01T11:12:00Z", "stopped 43 min ago"},
		{"stopped just before the last bucket", []int{0, 0, 0, 0, 1, 0}, "2026-03-01T11:49:30Z", "stopped 5 min ago"},
		{"stopped hours ago", []int{5, 0, 0, 0, 0, 0}, "2026-03-01T08:00:00Z", "stopped 3 h ago"},
		{"stopped days ago", []int{5, 0, 0, 0, 0, 0}, "2026-02-25T10:00:00Z", "stopped 4 d ago"},
		{"no failure time", []int{0, 0, 0, 0, 0, 0}, "0001-01-01T00:00:00Z", "no failure time"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.ActivityOf(tt.counts, at(tt.last)).Text(); got != tt.want {
				t.Errorf("%q, want %q", got, tt.want)
			}
		})
	}
}

func TestBucketText(t *testing.T) {
	for _, tt := range []struct {
		n    int
		from string
		step time.Duration
		want string
	}{
		{1, "2026-03-01T11:05:00Z", 5 * time.Minute, "1 failure, Mar 1 11:05–11:10 UTC"},
		{3, "2026-03-01T23:00:00Z", 2 * time.Hour, "3 failures, Mar 1 23:00–Mar 2 01:00 UTC"},
		{0, "2026-03-01T11:00:05Z", 5 * time.Second, "0 failures, Mar 1 11:00:05–11:00:10 UTC"},
		{7, "2026-03-01T00:00:00Z", 24 * time.Hour, "7 failures, Mar 1–Mar 2 UTC"},
	} {
		if got := bucketText(tt.n, at(tt.from), tt.step); got != tt.want {
			t.Errorf("bucketText(%d, %s, %v) = %q, want %q", tt.n, tt.from, tt.step, got, tt.want)
		}
	}
}
