package eagle3

import (
	"errors"
	"fmt"

	"webdraft/treemask"
)

// RowPlan is what a head's rows read, for the tokens one call feeds to one
// sequence: the same on every engine. A head's row j is token j+1's (token
// 0 has none). Stage[t] is the pass that computes token t's row: a row
// reading the head's own output at another row of the same call comes a
// stage after it; −1 for token 0. Feat[t] reports whether the row reads
// the target's features (through fc) rather than the head's output. Base
// and Nodes are the sequence's token tree after the call: its first node's
// token and how many nodes it holds.
type RowPlan struct {
	Stage       []int
	Feat        []bool
	Base, Nodes int
}

// PlanRows plans the rows of tokens L … L+len(place)−1 of a head's
// sequence, placed by place as the target engine places its own
// (treemask.Tree.Place). Line token i ≥ 1 is row j = i−1 over the target's
// features at position j while the target holds that position in its line
// (held positions; a token tree's nodes are no position of the text), else
// over the head's output at row j−1 — the row of the token before in this
// call (a stage after it), or the sequence's last row, outRow, which the
// sequence must still hold. A node is row slot−1 over the head's output at
// its parent's row — the line's last for a root — in the stage after its
// parent's where the call computes that row, else in the first, the
// sequence holding it. base and nodes are the sequence's tree before the
// call. An input the sequence no longer holds is an error.
func PlanRows(L int, place []treemask.Row, held, outRow, base, nodes int) (RowPlan, error) {
	T := len(place)
	p := RowPlan{Stage: make([]int, T), Feat: make([]bool, T), Base: base, Nodes: nodes}
	for t := range place {
		tok := L + t
		j := tok - 1 // the token's row; a line token's position and that of its features
		if parent := place[t].Parent; parent != treemask.Line {
			if p.Nodes == 0 {
				p.Base = tok
			}
			p.Nodes++
			switch {
			case parent == 0:
				return RowPlan{}, fmt.Errorf("node %d's parent is token 0, which has no row: %w", tok, ErrTokenZero)
			case parent >= L:
				p.Stage[t] = p.Stage[parent-L] + 1
			case parent < p.Base && outRow != parent-1:
				return RowPlan{}, fmt.Errorf("root %d reads the head's output at the line's last row %d, which the sequence no longer holds", tok, parent-1)
			}
			continue
		}
		switch {
		case tok == 0:
			p.Stage[t] = -1
		case j < held:
			p.Feat[t] = true
			if t > 0 {
				p.Stage[t] = max(p.Stage[t-1], 0)
			}
		case j == 0:
			return RowPlan{}, errors.New("token 1 reads the target's features at position 0, which its Target sequence does not hold")
		case t > 0:
			p.Stage[t] = p.Stage[t-1] + 1
		case outRow != j-1:
			return RowPlan{}, fmt.Errorf("token %d reads the target's features at position %d (its Target sequence holds %d) or the head's output at row %d, which the sequence no longer holds", tok, j, held, j-1)
		}
	}
	return p, nil
}

// ErrTokenZero is what a call that needs token 0's row is refused with: an
// EAGLE-3 head's first row is token 1's.
var ErrTokenZero = errors.New("an EAGLE-3 head's first row is token 1's")
