package console

import (
	"strconv"
	"strings"
	"time"
)

// Chart sizes. The overview's charts are small (a bar per interval, no
// axes); a group's page has one with axes, tick labels and a legend.
const (
	sparkBuckets = 30
	sparkBar     = 4 // px per bar
	sparkHeight  = 24
	bigBuckets   = 60
	bigWidth     = 900
	bigHeight    = 260
	bigLeft      = 56 // room for the y axis's labels and title
	bigRight     = 16
	bigTop       = 14
	bigBottom    = 46 // room for the x axis's labels and title
)

// chartView is a chart of failures per interval, as the SVG the templates
// draw: geometry worked out here, drawn there, styled by the style sheet
// (no inline style: the Content-Security-Policy allows none).
type chartView struct {
	Width, Height int
	Bars          []barView
	Counts        string // the buckets' counts, comma-separated: data-buckets
	From          string // the first bucket's start, RFC 3339: data-from
	StepSeconds   int    // data-step
	Total, Max    int
	Step          string // "5 min"
	Activity      Activity
	State         string // "now" or "stopped": the CSS class that colours it
	Summary       string // what the chart says, for its title
	// The large chart's axes.
	PlotLeft, PlotTop, PlotRight, PlotBottom int
	XTicks, YTicks                           []tickView
	NowX                                     float64
	MidX, MidY, TickEnd                      int    // the axis titles' middle, the x ticks' end
	Taken                                    string // the snapshot's time, for the legend
}

type barView struct {
	X, Y, W, H float64
	N          int
	Title      string
}

type tickView struct {
	X, Y  float64
	Label string
}

// queueSpan is the span the charts of snap's groups share: from its
// earliest failure to the snapshot.
func queueSpan(snap *Snapshot, maxBuckets int) Span {
	var first time.Time
	for _, m := range snap.Messages {
		if !m.FailedAt.IsZero() && (first.IsZero() || m.FailedAt.Before(first)) {
			first = m.FailedAt
		}
	}
	return NewSpan(first, snap.Taken, maxBuckets)
}

func failureTimes(g *Group) []time.Time {
	times := make([]time.Time, len(g.Messages))
	for i, m := range g.Messages {
		times[i] = m.FailedAt
	}
	return times
}

// newChart counts g's failures into s and lays out the bars.
func newChart(s Span, g *Group) chartView {
	counts := s.Count(failureTimes(g))
	c := chartView{Step: s.StepText(), Activity: s.ActivityOf(counts, g.LastFailed), Taken: when(s.Now),
		From: s.From.UTC().Format(time.RFC3339), StepSeconds: int(s.Step / time.Second)}
	c.State = "stopped"
	if c.Activity.Now {
		c.State = "now"
	}
	strs := make([]string, len(counts))
	for i, n := range counts {
		strs[i] = strconv.Itoa(n)
		c.Total += n
		c.Max = max(c.Max, n)
	}
	c.Counts = strings.Join(strs, ",")
	c.Summary = strconv.Itoa(c.Total) + " failures in " + strconv.Itoa(s.Buckets) + " intervals of " + c.Step +
		" up to the snapshot: " + c.Activity.Text()
	return c
}

// sparkChart is the overview's small chart of g.
func sparkChart(s Span, g *Group) chartView {
	c := newChart(s, g)
	counts := s.Count(failureTimes(g))
	c.Width, c.Height = s.Buckets*sparkBar, sparkHeight
	c.PlotBottom = sparkHeight
	for i, n := range counts {
		if n == 0 {
			continue
		}
		h := max(2, float64(n)/float64(c.Max)*float64(sparkHeight-2))
		c.Bars = append(c.Bars, barView{X: float64(i * sparkBar), Y: float64(sparkHeight) - h, W: sparkBar - 1, H: h, N: n,
			Title: bucketText(n, s.From.Add(time.Duration(i)*s.Step), s.Step)})
	}
	return c
}

// bigChart is a group page's chart of g, with axes and ticks, over s (the
// group's own span: from its first failure to the snapshot).
func bigChart(s Span, g *Group) chartView {
	c := newChart(s, g)
	counts := s.Count(failureTimes(g))
	c.Width, c.Height = bigWidth, bigHeight
	c.PlotLeft, c.PlotTop, c.PlotRight, c.PlotBottom = bigLeft, bigTop, bigWidth-bigRight, bigHeight-bigBottom
	c.MidX, c.MidY, c.TickEnd = (c.PlotLeft+c.PlotRight)/2, (c.PlotTop+c.PlotBottom)/2, c.PlotBottom+5
	plotW, plotH := float64(c.PlotRight-c.PlotLeft), float64(c.PlotBottom-c.PlotTop)
	barW := plotW / float64(max(1, s.Buckets))
	top := niceCeiling(c.Max)
	for i, n := range counts {
		x := float64(c.PlotLeft) + float64(i)*barW
		if n > 0 {
			h := max(1, float64(n)/float64(top)*plotH)
			c.Bars = append(c.Bars, barView{X: round1(x + barW*0.1), Y: round1(float64(c.PlotBottom) - h), W: round1(barW * 0.8), H: round1(h), N: n,
				Title: bucketText(n, s.From.Add(time.Duration(i)*s.Step), s.Step)})
		}
	}
	// The y axis: 0, the middle and the top, whole numbers.
	for _, v := range []int{0, top / 2, top} {
		if v == top/2 && (top%2 != 0 || top < 2) {
			continue
		}
		c.YTicks = append(c.YTicks, tickView{X: float64(c.PlotLeft), Y: round1(float64(c.PlotBottom) - float64(v)/float64(top)*plotH), Label: strconv.Itoa(v)})
	}
	// The x axis: a label every few buckets, six at most, the date shown at
	// the first and wherever the day changes.
	every := max(1, (s.Buckets+5)/6)
	prevDay := -1
	for i := 0; i <= s.Buckets; i += every {
		t := s.From.Add(time.Duration(i) * s.Step)
		day := t.UTC().YearDay()
		c.XTicks = append(c.XTicks, tickView{X: round1(float64(c.PlotLeft) + float64(i)*barW), Y: float64(c.PlotBottom),
			Label: tickText(t, s.Step, prevDay != day && s.Step < 24*time.Hour)})
		prevDay = day
	}
	c.NowX = round1(float64(c.PlotLeft) + float64(s.Now.Sub(s.From))/float64(s.Step)*barW)
	return c
}

// niceCeiling is the y axis's top for a largest count of n: n rounded up
// to 1, 2 or 5 times a power of ten, and at least 2 (so the middle tick is
// a whole number).
func niceCeiling(n int) int {
	if n <= 2 {
		return 2
	}
	for p := 1; ; p *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*p >= n {
				return m * p
			}
		}
	}
}

func round1(f float64) float64 { return float64(int(f*10+0.5)) / 10 }
