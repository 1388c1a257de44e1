package specdec

import (
	"bytes"
	"fmt"
)

// HistogramSVG draws the acceptance-length histogram (steps per number of
// accepted draft tokens, 0 … K) as a self-contained SVG bar chart.
func (r *Result) HistogramSVG(title string) []byte {
	const (
		w, h                     = 720, 360
		left, right, top, bottom = 60, 20, 60, 50
	)
	plotW, plotH := float64(w-left-right), float64(h-top-bottom)
	most := 1
	for _, n := range r.Hist {
		most = max(most, n)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, escape(title))
	fmt.Fprintf(&b, `<text x="%d" y="42">τ = %.2f tokens per step over %d steps, k = %d</text>`+"\n", left, r.Tau(), r.Steps, r.K)
	// Axes and horizontal grid lines at quarters of the tallest bar.
	for q := 0; q <= 4; q++ {
		y := float64(top) + plotH*(1-float64(q)/4)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, w-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%d</text>`+"\n", left-6, y, most*q/4)
	}
	bar := plotW / float64(len(r.Hist))
	for a, n := range r.Hist {
		bh := plotH * float64(n) / float64(most)
		x := float64(left) + float64(a)*bar
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#3b7dd8"><title>%d accepted: %d steps</title></rect>`+"\n",
			x+bar*0.1, float64(top)+plotH-bh, bar*0.8, bh, a, n)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x+bar/2, h-bottom+16, a)
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, h-bottom, w-right, h-bottom)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">draft tokens accepted per step</text>`+"\n", float64(left)+plotW/2, h-12)
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">steps</text>`+"\n", float64(top)+plotH/2)
	b.WriteString("</svg>\n")
	return b.Bytes()
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
