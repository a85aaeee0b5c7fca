package main

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// writeChart draws the happy-path medians as bars, each labelled with its
// msg/s and ratio to the baseline, into dir/throughput.png.
func writeChart(dir string, c *Comparison, subtitle string) error {
	if len(c.Variants) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = "Happy-path throughput, median msg/s\n" + subtitle
	p.Y.Label.Text = "msg/s"
	p.Y.Min = 0

	var (
		values plotter.Values
		names  []string
		labels plotter.XYLabels
		top    float64
	)
	for i, v := range c.Variants {
		values = append(values, v.MedianMsgPerSec)
		names = append(names, v.Name)
		text := fmt.Sprintf("%.0f", v.MedianMsgPerSec)
		if v.RatioToBaseline > 0 {
			text += fmt.Sprintf("\n×%.2f", v.RatioToBaseline)
		}
		labels.XYs = append(labels.XYs, plotter.XY{X: float64(i), Y: v.MedianMsgPerSec})
		labels.Labels = append(labels.Labels, text)
		top = max(top, v.MedianMsgPerSec)
	}
	bars, err := plotter.NewBarChart(values, vg.Points(50))
	if err != nil {
		return err
	}
	bars.Color = color.RGBA{R: 0x4c, G: 0x72, B: 0xb0, A: 0xff}
	bars.LineStyle.Width = 0
	lbl, err := plotter.NewLabels(labels)
	if err != nil {
		return err
	}
	for i := range lbl.TextStyle {
		// Centred above the bar.
		lbl.TextStyle[i].XAlign = -0.5
		lbl.TextStyle[i].YAlign = 0
	}
	p.Add(bars, lbl)
	p.NominalX(names...)
	// Half a slot of room on either side, and room above for the labels.
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	p.Y.Max = top * 1.25
	p.Y.Tick.Marker = wholeNumberTicks
	png, err := p.WriterTo(6*vg.Inch, 4*vg.Inch, "png")
	if err != nil {
		return err
	}
	return writeAtomically(filepath.Join(dir, "throughput.png"), png)
}

// writeAtomically writes through a temporary file, so that a crash never
// leaves half a file where the last good one was.
func writeAtomically(path string, data io.WriterTo) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = data.WriteTo(f)
	if err := errors.Join(err, f.Close()); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return os.Rename(tmp, path)
}

// wholeNumberTicks are gonum's default ticks labelled without decimals:
// msg/s are counted in thousands, not hundredths.
var wholeNumberTicks = plot.TickerFunc(func(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i, t := range ticks {
		if t.Label != "" {
			ticks[i].Label = fmt.Sprintf("%.0f", t.Value)
		}
	}
	return ticks
})
