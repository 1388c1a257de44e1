package eagle3

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"webdraft/treemask"
)

func TestPlanRows(t *testing.T) {
	line := func(n int) []treemask.Row {
		rows := make([]treemask.Row, n)
		for i := range rows {
			rows[i].Parent = treemask.Line
		}
		return rows
	}
	nodes := func(parents ...int) []treemask.Row {
		rows := make([]treemask.Row, len(parents))
		for i, p := range parents {
			rows[i].Parent = p
		}
		return rows
	}
	for _, c := range []struct {
		name                  string
		L                     int
		place                 []treemask.Row
		held, outRow, base, n int
		stage                 []int
		feat                  []bool
		wantBase, wantNodes   int
		err                   string
	}{
		{name: "a prompt over the target's features", L: 0, place: line(4), held: 4, outRow: -1,
			stage: []int{-1, 0, 0, 0}, feat: []bool{false, true, true, true}},
		{name: "past the target's line, over the head's last row", L: 5, place: line(3), held: 4, outRow: 3,
			stage: []int{0, 1, 2}, feat: []bool{false, false, false}},
		{name: "features, then the head's own rows", L: 3, place: line(3), held: 4, outRow: -1,
			stage: []int{0, 0, 1}, feat: []bool{true, true, false}},
		{name: "a root and its child", L: 5, place: nodes(4, 5, 4), held: 4, outRow: 3,
			stage: []int{0, 1, 0}, feat: []bool{false, false, false}, wantBase: 5, wantNodes: 3},
		{name: "a node of a tree fed before", L: 7, place: nodes(5), held: 4, outRow: 3, base: 5, n: 2,
			stage: []int{0}, feat: []bool{false}, wantBase: 5, wantNodes: 3},
		{name: "the head's last row dropped", L: 5, place: line(1), held: 4, outRow: -1,
			err: "token 5 reads the target's features at position 4 (its Target sequence holds 4) or the head's output at row 3, which the sequence no longer holds"},
		{name: "a root without the line's last row", L: 5, place: nodes(4), held: 4, outRow: 2,
			err: "root 5 reads the head's output at the line's last row 3, which the sequence no longer holds"},
		{name: "token 1 without features", L: 1, place: line(1), held: 0, outRow: -1,
			err: "token 1 reads the target's features at position 0"},
		{name: "a node under token 0", L: 1, place: nodes(0), held: 1, outRow: -1, err: "node 1's parent is token 0"},
	} {
		p, err := PlanRows(c.L, c.place, c.held, c.outRow, c.base, c.n)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one holding %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !slices.Equal(p.Stage, c.stage) || !slices.Equal(p.Feat, c.feat) || p.Base != c.wantBase || p.Nodes != c.wantNodes {
			t.Errorf("%s: stages %v, features %v, base %d, nodes %d; want %v, %v, %d, %d",
				c.name, p.Stage, p.Feat, p.Base, p.Nodes, c.stage, c.feat, c.wantBase, c.wantNodes)
		}
	}
	if _, err := PlanRows(1, nodes(0), 1, -1, 0, 0); !errors.Is(err, ErrTokenZero) {
		t.Errorf("a node under token 0: %v, want ErrTokenZero", err)
	}
}
