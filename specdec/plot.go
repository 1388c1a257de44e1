package specdec

import (
	"fmt"

	"webdraft/internal/svgplot"
)

// HistogramSVG draws the acceptance-length histogram (steps per number of
// accepted draft tokens, 0 … K) as a self-contained SVG bar chart.
func (r *Result) HistogramSVG(title string) []byte {
	c := svgplot.Bars{
		Title:    title,
		Subtitle: fmt.Sprintf("τ = %.2f tokens per step over %d steps, k = %d", r.Tau(), r.Steps, r.K),
		XLabel:   "draft tokens accepted per step",
		YLabel:   "steps",
	}
	for a, n := range r.Hist {
		c.Labels = append(c.Labels, fmt.Sprint(a))
		c.Values = append(c.Values, float64(n))
	}
	return c.SVG()
}
