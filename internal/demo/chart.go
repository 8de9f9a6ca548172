package demo

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// writeChart draws freshness over time with its P50 and P99 as an SVG.
func writeChart(path string, rep *Report) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Retina freshness under %.0f row changes/s (HyBench-like SF %g)", rep.RowsPerSec, rep.ScaleFactor)
	p.X.Label.Text = "time since the change stream started (s)"
	p.Y.Label.Text = "freshness (ms)"
	p.Add(plotter.NewGrid())
	xys := make(plotter.XYs, len(rep.samples))
	for i, s := range rep.samples {
		xys[i] = plotter.XY{X: s.At.Seconds(), Y: ms(s.Freshness)}
	}
	line, err := plotter.NewLine(xys)
	if err != nil {
		return fmt.Errorf("demo: chart: %w", err)
	}
	line.Color = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	p.Add(line)
	p.Legend.Add("probe (now − max fresh_ts)", line)
	for _, ref := range []struct {
		name string
		v    float64
		c    color.RGBA
	}{
		{fmt.Sprintf("P50 %.1f ms", rep.FreshnessP50ms), rep.FreshnessP50ms, color.RGBA{G: 150, A: 255}},
		{fmt.Sprintf("P99 %.1f ms", rep.FreshnessP99ms), rep.FreshnessP99ms, color.RGBA{R: 214, G: 39, B: 40, A: 255}},
	} {
		f := plotter.NewFunction(func(float64) float64 { return ref.v })
		f.Color = ref.c
		f.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(f)
		p.Legend.Add(ref.name, f)
	}
	p.Legend.Top = true
	p.Y.Min = 0
	if err := p.Save(10*vg.Inch, 4*vg.Inch, path); err != nil {
		return fmt.Errorf("demo: chart: %w", err)
	}
	return nil
}
