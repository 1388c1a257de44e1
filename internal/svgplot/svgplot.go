// Package svgplot draws the project's small charts — acceptance-length
// histograms, milliseconds per step against batch size — as self-contained
// SVG: no fonts, scripts or files beyond the one document.
package svgplot

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
)

// Bars is a bar chart: one bar per label, its height the value.
type Bars struct {
	Title, Subtitle string
	XLabel, YLabel  string
	Labels          []string  // under each bar
	Values          []float64 // bar heights, ≥ 0
	// Notes, when set, are printed above each bar (e.g. a second figure).
	Notes []string
}

// SVG renders the chart, 720×360.
func (c Bars) SVG() []byte {
	const (
		w, h                     = 720, 360
		left, right, top, bottom = 70, 20, 60, 50
	)
	plotW, plotH := float64(w-left-right), float64(h-top-bottom)
	most := 0.0
	for _, v := range c.Values {
		most = math.Max(most, v)
	}
	if most <= 0 {
		most = 1
	}
	var b bytes.Buffer
	header(&b, w, h, left, c.Title, c.Subtitle)
	// Horizontal grid lines at quarters of the tallest bar.
	for q := 0; q <= 4; q++ {
		y := float64(top) + plotH*(1-float64(q)/4)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, w-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-6, y, tick(most*float64(q)/4))
	}
	bar := plotW / float64(max(len(c.Values), 1))
	for i, v := range c.Values {
		bh := plotH * v / most
		x := float64(left) + float64(i)*bar
		label := ""
		if i < len(c.Labels) {
			label = c.Labels[i]
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#3b7dd8"><title>%s: %s</title></rect>`+"\n",
			x+bar*0.1, float64(top)+plotH-bh, bar*0.8, bh, escape(label), tick(v))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x+bar/2, h-bottom+16, escape(label))
		if i < len(c.Notes) && c.Notes[i] != "" {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11">%s</text>`+"\n", x+bar/2, float64(top)+plotH-bh-4, escape(c.Notes[i]))
		}
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, h-bottom, w-right, h-bottom)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(left)+plotW/2, h-12, escape(c.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(top)+plotH/2, escape(c.YLabel))
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// header opens a w×h document on white with its title and subtitle.
func header(b *bytes.Buffer, w, h, left int, title, subtitle string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, escape(title))
	fmt.Fprintf(b, `<text x="%d" y="42">%s</text>`+"\n", left, escape(subtitle))
}

// tick formats an axis or bar value with at most three significant digits.
func tick(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e6 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func escape(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
