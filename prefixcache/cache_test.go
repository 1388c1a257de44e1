package prefixcache

import (
	"math/rand/v2"
	"testing"
)

// fakeSeq records whether it was released.
type fakeSeq struct {
	id       int
	released bool
}

func (s *fakeSeq) Len() int             { return 0 }
func (s *fakeSeq) Truncate(n int)       {}
func (s *fakeSeq) KeepPath([]int) error { return nil }
func (s *fakeSeq) Release()             { s.released = true }

func TestTakeLongestPrefix(t *testing.T) {
	c := New(1000)
	a, b, d := &fakeSeq{id: 1}, &fakeSeq{id: 2}, &fakeSeq{id: 3}
	c.Put([]int{1, 2, 3, 4, 5}, a)
	c.Put([]int{1, 2, 9, 9}, b)
	c.Put([]int{7}, d)
	cases := []struct {
		tokens []int
		seq    *fakeSeq
		shared int
	}{
		{[]int{1, 2, 3, 4, 5, 6, 7}, a, 5}, // extends a cached sequence
		{[]int{1, 2, 3, 8}, a, 3},          // diverges in the middle of one
		{[]int{1, 2, 9, 9, 9}, b, 4},
		{[]int{7, 7}, d, 1},
		{[]int{1, 2, 3}, a, 3}, // a prefix of a cached sequence
	}
	for _, tc := range cases {
		e, shared := c.Take(tc.tokens)
		if e == nil || e.Seq != tc.seq || shared != tc.shared {
			t.Fatalf("Take(%v) = %v, %d; want seq %d, %d", tc.tokens, e, shared, tc.seq.id, tc.shared)
		}
		c.Put(e.Tokens, e.Seq) // back for the next case
	}
	if e, shared := c.Take([]int{5, 5}); e != nil || shared != 0 {
		t.Errorf("no shared prefix: got %v, %d", e, shared)
	}
}

func TestEvictsLeastRecentlyUsed(t *testing.T) {
	c := New(10)
	s1, s2, s3 := &fakeSeq{id: 1}, &fakeSeq{id: 2}, &fakeSeq{id: 3}
	c.Put([]int{1, 1, 1, 1}, s1)
	c.Put([]int{2, 2, 2, 2}, s2)
	e, _ := c.Take([]int{1, 1}) // s1 is used again: s2 is now the oldest
	c.Put(e.Tokens, e.Seq)
	c.Put([]int{3, 3, 3, 3}, s3) // 12 tokens > 10: evict s2
	if !s2.released || s1.released || s3.released {
		t.Errorf("released: s1 %v s2 %v s3 %v; want only s2", s1.released, s2.released, s3.released)
	}
	if c.Tokens() != 8 || c.Len() != 2 {
		t.Errorf("Tokens %d Len %d", c.Tokens(), c.Len())
	}
	if e, n := c.Take([]int{2, 2}); e != nil {
		t.Errorf("evicted sequence found again (%d shared)", n)
	}
	c.Clear()
	if !s1.released || !s3.released || c.Len() != 0 || c.Tokens() != 0 {
		t.Error("Clear left sequences behind")
	}
}

// TestMatchesBruteForce drives the tree with random puts and takes over a
// small alphabet (many shared prefixes, splits and merges) and checks every
// answer against a linear scan.
func TestMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	c := New(1 << 30)
	held := map[*fakeSeq][]int{}
	randTokens := func() []int {
		p := make([]int, 1+rng.IntN(12))
		for i := range p {
			p[i] = rng.IntN(3)
		}
		return p
	}
	for step := 0; step < 20000; step++ {
		if rng.IntN(2) == 0 || len(held) == 0 {
			s := &fakeSeq{id: step}
			tok := randTokens()
			c.Put(tok, s)
			held[s] = tok
			continue
		}
		q := randTokens()
		best := 0
		for _, tok := range held {
			best = max(best, commonPrefix(tok, q))
		}
		e, shared := c.Take(q)
		if shared != best {
			t.Fatalf("step %d: Take(%v) shared %d, brute force %d", step, q, shared, best)
		}
		if best == 0 {
			continue
		}
		s := e.Seq.(*fakeSeq)
		if got := commonPrefix(held[s], q); got != best {
			t.Fatalf("step %d: returned a sequence sharing %d, want %d", step, got, best)
		}
		delete(held, s)
		if c.Len() != len(held) || c.root.count != len(held) {
			t.Fatalf("step %d: Len %d, tree count %d, want %d", step, c.Len(), c.root.count, len(held))
		}
	}
}
