package demo

import (
	"fmt"
	"image/color"
	"path/filepath"

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

// soakSeries are the soak report's charts: file name, title, unit and the
// lines of each.
var soakSeries = []struct {
	file, title, unit string
	lines             []soakLine
}{
	{"rss.svg", "Resident memory", "MiB", []soakLine{{"RSS", func(s SoakSample) float64 { return mib(s.RSSBytes) }}, {"Go heap", func(s SoakSample) float64 { return mib(s.HeapBytes) }}}},
	{"visibility.svg", "Visibility and write-buffer memory", "MiB", []soakLine{{"visibility", func(s SoakSample) float64 { return mib(s.VisibilityBytes) }}, {"write buffers", func(s SoakSample) float64 { return mib(s.BufferBytes) }}}},
	{"index.svg", "Index versions", "versions", []soakLine{{"index versions", func(s SoakSample) float64 { return float64(s.IndexVersions) }}}},
	{"lake.svg", "Lake bytes and live bytes", "MiB", []soakLine{{"lake", func(s SoakSample) float64 { return mib(s.LakeBytes) }}, {"live", func(s SoakSample) float64 { return mib(s.LiveBytes) }}}},
	{"stale.svg", "Stale share of stored versions", "share", []soakLine{{"stale share", func(s SoakSample) float64 { return s.StaleShare }}}},
	{"freshness.svg", "Freshness", "ms", []soakLine{{"P50", func(s SoakSample) float64 { return s.FreshP50ms }}, {"P99", func(s SoakSample) float64 { return s.FreshP99ms }}}},
	{"ap.svg", "Analytical query latency (median of the interval)", "ms", []soakLine{{"AP", func(s SoakSample) float64 { return s.APms }}}},
	{"lwm.svg", "LWM lag (age of the oldest snapshot)", "s", []soakLine{{"LWM lag", func(s SoakSample) float64 { return s.LWMLagS }}}},
}

type soakLine struct {
	name  string
	value func(SoakSample) float64
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// writeSoakCharts draws each soak series over time as an SVG in dir.
func writeSoakCharts(dir string, res *SoakResult) error {
	colors := []color.RGBA{{R: 31, G: 119, B: 180, A: 255}, {R: 214, G: 39, B: 40, A: 255}}
	for _, series := range soakSeries {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s — soak at %.0f row changes/s", series.title, res.RowsPerSec)
		p.X.Label.Text = "time since the change stream started (s)"
		p.Y.Label.Text = series.unit
		p.Add(plotter.NewGrid())
		for i, l := range series.lines {
			xys := make(plotter.XYs, len(res.Samples))
			for j, s := range res.Samples {
				xys[j] = plotter.XY{X: s.AtS, Y: l.value(s)}
			}
			line, err := plotter.NewLine(xys)
			if err != nil {
				return fmt.Errorf("soak: chart %s: %w", series.file, err)
			}
			line.Color = colors[i%len(colors)]
			p.Add(line)
			p.Legend.Add(l.name, line)
		}
		p.Legend.Top = true
		p.Y.Min = 0
		if err := p.Save(10*vg.Inch, 4*vg.Inch, filepath.Join(dir, series.file)); err != nil {
			return fmt.Errorf("soak: chart %s: %w", series.file, err)
		}
	}
	return nil
}
