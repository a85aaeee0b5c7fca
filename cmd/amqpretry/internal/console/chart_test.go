package console

import (
	"testing"
	"time"
)

func TestNiceCeiling(t *testing.T) {
	for n, want := range map[int]int{0: 2, 1: 2, 2: 2, 3: 5, 5: 5, 6: 10, 11: 20, 21: 50, 99: 100, 101: 200, 4321: 5000} {
		if got := niceCeiling(n); got != want {
			t.Errorf("niceCeiling(%d) = %d, want %d", n, got, want)
		}
	}
}

// A chart's bars are its non-empty buckets, the tallest full height, each
// titled with its count and interval; the y axis ends on a round number.
func TestChartLayout(t *testing.T) {
	s := Span{From: at("2026-03-01T11:00:00Z"), Step: 10 * time.Minute, Buckets: 6, Now: at("2026-03-01T11:55:00Z")}
	var msgs []*Message
	for _, x := range []string{"2026-03-01T11:01:00Z", "2026-03-01T11:02:00Z", "2026-03-01T11:03:00Z", "2026-03-01T11:04:00Z", "2026-03-01T11:52:00Z"} {
		msgs = append(msgs, &Message{FailedAt: at(x)})
	}
	g := &Group{Messages: msgs, FirstFailed: msgs[0].FailedAt, LastFailed: msgs[4].FailedAt}
	spark := sparkChart(s, g)
	if spark.Counts != "4,0,0,0,0,1" || len(spark.Bars) != 2 || spark.State != "now" || spark.Width != 6*sparkBar {
		t.Fatalf("spark: %+v", spark)
	}
	if b := spark.Bars[0]; b.N != 4 || b.H != sparkHeight-2 || b.Y != 2 || b.Title != "4 failures, Mar 1 11:00–11:10 UTC" {
		t.Errorf("the tallest bar: %+v", b)
	}
	big := bigChart(s, g)
	if len(big.YTicks) != 2 || big.YTicks[1].Label != "5" || len(big.XTicks) != 7 || big.XTicks[0].Label != "Mar 1 11:00" || big.XTicks[1].Label != "11:10" {
		t.Errorf("axes: y %+v, x %+v", big.YTicks, big.XTicks)
	}
	if big.NowX <= big.Bars[1].X || big.NowX > float64(big.PlotRight) {
		t.Errorf("the snapshot's line at %v, the last bar at %v, the plot ends at %d", big.NowX, big.Bars[1].X, big.PlotRight)
	}
}
