package svgplot

import (
	"bytes"
	"fmt"
	"math"
)

// Lines is a line chart: series of y over a shared x axis (time, say).
type Lines struct {
	Title, Subtitle string
	XLabel, YLabel  string
	Series          []Series
}

// Series is one line: its name in the legend, and its points, x rising.
type Series struct {
	Name string
	X, Y []float64
	// Dash, when set, is the line's stroke-dasharray ("6 3"), so that
	// series differ by more than colour.
	Dash string
}

var lineColours = []string{"#3b7dd8", "#d8703b", "#3ba55d", "#9b59b6"}

// SVG renders the chart, 720×360; the y axis starts at 0.
func (c Lines) SVG() []byte {
	const (
		w, h                     = 720, 360
		left, right, top, bottom = 70, 20, 76, 50
	)
	plotW, plotH := float64(w-left-right), float64(h-top-bottom)
	xMin, xMax, yMax := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range c.Series {
		for i := range s.X {
			xMin, xMax = math.Min(xMin, s.X[i]), math.Max(xMax, s.X[i])
			yMax = math.Max(yMax, s.Y[i])
		}
	}
	if !(xMax > xMin) {
		xMin, xMax = 0, 1
	}
	if xMin > 0 && xMin < 0.05*(xMax-xMin) {
		xMin = 0 // a series that starts just after 0 (a first sample) starts the axis at 0
	}
	if yMax <= 0 {
		yMax = 1
	}
	px := func(x float64) float64 { return float64(left) + plotW*(x-xMin)/(xMax-xMin) }
	py := func(y float64) float64 { return float64(top) + plotH*(1-y/yMax) }
	var b bytes.Buffer
	header(&b, w, h, left, c.Title, c.Subtitle)
	for q := 0; q <= 4; q++ {
		y := py(yMax * float64(q) / 4)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, w-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-6, y, tick(yMax*float64(q)/4))
		x := px(xMin + (xMax-xMin)*float64(q)/4)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, h-bottom+16, tick(xMin+(xMax-xMin)*float64(q)/4))
	}
	for i, s := range c.Series {
		colour := lineColours[i%len(lineColours)]
		var pts bytes.Buffer
		for j := range s.X {
			fmt.Fprintf(&pts, "%.1f,%.1f ", px(s.X[j]), py(s.Y[j]))
		}
		dash := ""
		if s.Dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.Dash)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"><title>%s</title></polyline>`+"\n", colour, dash, bytes.TrimSpace(pts.Bytes()), escape(s.Name))
		// The legend, above the plot in a row, each entry with its line's
		// colour and dash, so that no line runs under it.
		lx := left + 170*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", lx, top-10, lx+25, top-10, colour, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d" dominant-baseline="middle">%s</text>`+"\n", lx+30, top-10, escape(s.Name))
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, h-bottom, w-right, h-bottom)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(left)+plotW/2, h-12, escape(c.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(top)+plotH/2, escape(c.YLabel))
	b.WriteString("</svg>\n")
	return b.Bytes()
}
