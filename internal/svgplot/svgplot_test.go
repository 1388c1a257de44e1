package svgplot

import (
	"encoding/xml"
	"strings"
	"testing"
)

func TestBarsIsWellFormed(t *testing.T) {
	for _, c := range []Bars{
		{Title: "a <b> & c", Labels: []string{"1", "2"}, Values: []float64{3, 0.25}, Notes: []string{"x", ""}},
		{Title: "empty"},
		{Title: "zeros", Labels: []string{"0"}, Values: []float64{0}},
	} {
		svg := c.SVG()
		if err := xml.Unmarshal(svg, new(struct{})); err != nil {
			t.Errorf("%q: %v", c.Title, err)
		}
		if got := strings.Count(string(svg), "<rect"); got != 1+len(c.Values) {
			t.Errorf("%q: %d rects, want %d", c.Title, got, 1+len(c.Values))
		}
	}
}

func TestLinesIsWellFormed(t *testing.T) {
	for _, c := range []Lines{
		{Title: "a <b> & c", Series: []Series{{Name: "rss", X: []float64{0, 1, 2}, Y: []float64{5, 6, 5}}, {Name: "heap", X: []float64{0, 2}, Y: []float64{1, 2}, Dash: "6 3"}}},
		{Title: "empty"},
		{Title: "one point", Series: []Series{{Name: "x", X: []float64{3}, Y: []float64{0}}}},
	} {
		svg := string(c.SVG())
		if err := xml.Unmarshal([]byte(svg), new(struct{})); err != nil {
			t.Errorf("%q: %v", c.Title, err)
		}
		if got := strings.Count(svg, "<polyline"); got != len(c.Series) {
			t.Errorf("%q: %d lines, want %d", c.Title, got, len(c.Series))
		}
		if strings.Contains(svg, "NaN") || strings.Contains(svg, "Inf") {
			t.Errorf("%q: a coordinate is not a number", c.Title)
		}
	}
}
