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
