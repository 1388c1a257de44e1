// Package textstats measures how repetitive generated token sequences are:
// whether a continuation falls into a loop, and the share of its n-grams
// that are distinct (distinct-n).
package textstats

import (
	"encoding/binary"
	"math"
)

// The figures `webdraft bench spec` reports: a continuation loops when a
// run of LoopRun consecutive tokens occurs LoopTimes times in it without
// overlap; distinct-DistinctOrder is its distinct 4-gram share.
const (
	LoopRun       = 12
	LoopTimes     = 3
	DistinctOrder = 4
)

// Loops reports whether some run of run consecutive tokens occurs at least
// times times in tokens without overlap, occurrences of each run counted
// left to right (an occurrence counts when it starts at or after the end
// of the last one counted). It is false when run or times is below 1.
func Loops(tokens []int, run, times int) bool {
	if run < 1 || times < 1 {
		return false
	}
	type seen struct{ count, last int } // occurrences counted; the last one's start
	runs := map[string]*seen{}
	for i := 0; i+run <= len(tokens); i++ {
		k := key(tokens[i : i+run])
		s := runs[k]
		if s == nil {
			s = &seen{}
			runs[k] = s
		}
		if s.count == 0 || i >= s.last+run {
			s.count++
			s.last = i
			if s.count >= times {
				return true
			}
		}
	}
	return false
}

// DistinctN is the number of distinct n-grams of tokens over the number of
// its n-grams (len(tokens) − n + 1): 1 when none repeats, near 0 for a
// loop. It is NaN when tokens has no n-gram (fewer than n tokens, or n
// below 1).
func DistinctN(tokens []int, n int) float64 {
	total := len(tokens) - n + 1
	if n < 1 || total < 1 {
		return math.NaN()
	}
	grams := make(map[string]struct{}, total)
	for i := range total {
		grams[key(tokens[i:i+n])] = struct{}{}
	}
	return float64(len(grams)) / float64(total)
}

// Summary is the figures over a set of sequences.
type Summary struct {
	Sequences int
	// Looping counts the sequences that Loops(s, LoopRun, LoopTimes).
	Looping int
	// Distinct is the mean DistinctN(s, DistinctOrder) over the sequences
	// that have a 4-gram (NaN when none has); Measured counts those.
	Distinct float64
	Measured int
}

// LoopRate is the share of the sequences that loop (0 without sequences).
func (s Summary) LoopRate() float64 {
	if s.Sequences == 0 {
		return 0
	}
	return float64(s.Looping) / float64(s.Sequences)
}

// Summarize measures seqs.
func Summarize(seqs [][]int) Summary {
	s := Summary{Sequences: len(seqs)}
	sum := 0.0
	for _, q := range seqs {
		if Loops(q, LoopRun, LoopTimes) {
			s.Looping++
		}
		if d := DistinctN(q, DistinctOrder); !math.IsNaN(d) {
			sum += d
			s.Measured++
		}
	}
	s.Distinct = math.NaN()
	if s.Measured > 0 {
		s.Distinct = sum / float64(s.Measured)
	}
	return s
}

// key is an exact map key for a run of tokens.
func key(run []int) string {
	b := make([]byte, 0, 8*len(run))
	for _, t := range run {
		b = binary.LittleEndian.AppendUint64(b, uint64(t))
	}
	return string(b)
}
