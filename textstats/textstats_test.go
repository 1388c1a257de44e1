package textstats

import (
	"math"
	"slices"
	"testing"
)

// seq is 0, 1, …, n−1 plus base: n tokens with no repeat.
func seq(base, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = base + i
	}
	return s
}

// repeat is body n times.
func repeat(body []int, n int) []int {
	var s []int
	for range n {
		s = append(s, body...)
	}
	return s
}

func cat(parts ...[]int) []int { return slices.Concat(parts...) }

func TestLoops(t *testing.T) {
	body5 := []int{7, 8, 9, 10, 11}
	body12 := seq(100, 12)
	cases := []struct {
		name       string
		tokens     []int
		run, times int
		want       bool
	}{
		{"empty", nil, 12, 3, false},
		{"shorter than a run", seq(0, 11), 12, 3, false},
		{"no repeat", seq(0, 200), 12, 3, false},
		// "return 1\n" over and over: one token, 36 times, holds three
		// disjoint 12-token runs; 35 times only two (the other 22
		// occurrences overlap those).
		{"period 1, 36 tokens", repeat([]int{5}, 36), 12, 3, true},
		{"period 1, 35 tokens: overlapping occurrences do not count", repeat([]int{5}, 35), 12, 3, false},
		// A 5-token loop: disjoint occurrences of a 12-token run are 15
		// apart (a multiple of 5, ≥ 12), so three need 42 tokens.
		{"period 5, 9 times (45 tokens)", repeat(body5, 9), 12, 3, true},
		{"period 5, 8 times (40 tokens)", repeat(body5, 8), 12, 3, false},
		{"period 5 repeated 3 times, run 5", repeat(body5, 3), 5, 3, true},
		{"period 5 repeated 3 times, run 12", repeat(body5, 3), 12, 3, false},
		{"12-gram three times, apart", cat(seq(0, 7), body12, seq(20, 3), body12, seq(40, 30), body12, seq(80, 2)), 12, 3, true},
		{"12-gram three times, back to back", repeat(body12, 3), 12, 3, true},
		{"12-gram only twice", cat(seq(0, 7), body12, seq(20, 3), body12, seq(40, 30)), 12, 3, false},
		{"12-gram twice, times 2", cat(body12, seq(20, 3), body12), 12, 2, true},
		// 1 2 1 2 occurs at 0, 2 and 4, the middle one overlapping both
		// others: left to right, the first and the third count, two.
		{"overlapping occurrences", cat([]int{1, 2, 1, 2, 1, 2, 1, 2}, seq(50, 20)), 4, 3, false},
		{"overlapping, then a third apart", cat([]int{1, 2, 1, 2, 1, 2, 1, 2}, seq(50, 3), []int{1, 2, 1, 2}), 4, 3, true},
		{"times 1: any run", seq(0, 12), 12, 1, true},
		{"run 0", seq(0, 12), 0, 3, false},
		{"times 0", seq(0, 12), 12, 0, false},
	}
	for _, c := range cases {
		if got := Loops(c.tokens, c.run, c.times); got != c.want {
			t.Errorf("%s: Loops(%v, %d, %d) = %v, want %v", c.name, c.tokens, c.run, c.times, got, c.want)
		}
	}
}

func TestDistinctN(t *testing.T) {
	cases := []struct {
		name   string
		tokens []int
		n      int
		want   float64 // NaN: no n-gram
	}{
		{"empty", nil, 4, math.NaN()},
		{"shorter than n", []int{1, 2, 3}, 4, math.NaN()},
		{"n 0", []int{1, 2, 3}, 0, math.NaN()},
		{"exactly n", []int{1, 2, 3, 4}, 4, 1},
		{"no repeat", seq(0, 50), 4, 1},
		{"one token over and over", repeat([]int{5}, 20), 4, 1.0 / 17},
		// 1 2 3 1 2 3 1 2: 4-grams 1231, 2312, 3123, 1231, 2312 — three
		// distinct of five.
		{"period 3", []int{1, 2, 3, 1, 2, 3, 1, 2}, 4, 3.0 / 5},
		{"unigrams", []int{1, 1, 2, 3}, 1, 3.0 / 4},
		// The same tokens in another order are other 4-grams.
		{"order matters", []int{1, 2, 3, 4, 4, 3, 2, 1}, 4, 1},
	}
	for _, c := range cases {
		got := DistinctN(c.tokens, c.n)
		if math.IsNaN(c.want) != math.IsNaN(got) || !math.IsNaN(c.want) && math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: DistinctN(%v, %d) = %v, want %v", c.name, c.tokens, c.n, got, c.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	s := Summarize([][]int{repeat([]int{5}, 40), seq(0, 40), {1, 2}})
	// One loops of three; distinct-4 averages over the two with a 4-gram.
	if s.Sequences != 3 || s.Looping != 1 || s.Measured != 2 {
		t.Errorf("%+v", s)
	}
	if want := (1.0/37 + 1) / 2; math.Abs(s.Distinct-want) > 1e-12 || math.Abs(s.LoopRate()-1.0/3) > 1e-12 {
		t.Errorf("distinct-4 %v (want %v), loop rate %v", s.Distinct, want, s.LoopRate())
	}
	if e := Summarize(nil); e.LoopRate() != 0 || !math.IsNaN(e.Distinct) {
		t.Errorf("no sequences: %+v", e)
	}
}
