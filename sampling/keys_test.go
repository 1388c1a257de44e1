package sampling

import "testing"

// TestKeys: a position's key is a coupled draw without a proposal whose
// two words are floats in [0, 1) of 24 bits; keys differ from position to
// position and from seed to seed — a seed's high half moves both words,
// as its low half does — and repeat for the same seed and position.
func TestKeys(t *testing.T) {
	seen := map[[2]float32]bool{}
	seeds := []uint64{0, 1, 2, 1 << 32, 2 << 32, 0xdeadbeef_cafef00d}
	for _, seed := range seeds {
		k := NewKeys(seed)
		for pos := range 2000 {
			d := k.At(pos)
			if !d.Coupled || d.X != NoProposal {
				t.Fatalf("seed %#x, position %d: %+v, want a coupled draw without a proposal", seed, pos, d)
			}
			for _, u := range []float32{d.U, d.V} {
				if u < 0 || u >= 1 || u*(1<<24) != float32(int(u*(1<<24))) {
					t.Fatalf("seed %#x, position %d: word %v, want a float in [0, 1) of 24 bits", seed, pos, u)
				}
			}
			if seen[[2]float32{d.U, d.V}] {
				t.Fatalf("seed %#x, position %d: key %v seen before", seed, pos, d)
			}
			seen[[2]float32{d.U, d.V}] = true
			if again := k.At(pos); again != d {
				t.Fatalf("seed %#x, position %d: %+v, then %+v", seed, pos, d, again)
			}
		}
	}
	same := 0
	for pos := range 2000 {
		a, b := NewKeys(5).At(pos), NewKeys(5|1<<40).At(pos)
		if a.U == b.U || a.V == b.V {
			same++
		}
	}
	if same > 2 {
		t.Errorf("seeds apart in their high half only: %d of 2000 positions share a word of their keys", same)
	}
}
