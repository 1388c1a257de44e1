package main

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// instruction is one line of nvdisasm's output.
type instruction struct {
	Addr   uint64
	Op     string // the mnemonic with its modifiers: FFMA.FTZ, LDS.128
	Target uint64 // a branch's target (BRA), else 0
	Branch bool
}

var (
	// "        /*0c40*/    @!P1 BRA 0x2410 ;"
	sassLine = regexp.MustCompile(`/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;`)
	predRE   = regexp.MustCompile(`^@!?U?P[0-9T]\s+`)
	targetRE = regexp.MustCompile(`0x([0-9a-f]+)`)
)

// parseSASS returns the instructions of nvdisasm's text, in order.
func parseSASS(text string) []instruction {
	var ins []instruction
	for _, line := range strings.Split(text, "\n") {
		m := sassLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		addr, err := strconv.ParseUint(m[1], 16, 64)
		if err != nil {
			continue
		}
		body := predRE.ReplaceAllString(m[2], "")
		fields := strings.Fields(body)
		if len(fields) == 0 {
			continue
		}
		in := instruction{Addr: addr, Op: fields[0]}
		if in.Op == "BRA" {
			if t := targetRE.FindStringSubmatch(body); t != nil {
				in.Target, _ = strconv.ParseUint(t[1], 16, 64)
				in.Branch = true
			}
		}
		ins = append(ins, in)
	}
	return ins
}

// loop is a backward branch's range of instructions.
type loop struct {
	From, To uint64 // the first and the branching instruction's addresses
	Ops      map[string]int
	N        int
}

// loops returns the backward branches' ranges of at least minLen
// instructions, outermost first where they start together.
func loops(ins []instruction, minLen int) []loop {
	var ls []loop
	for _, b := range ins {
		if !b.Branch || b.Target >= b.Addr {
			continue
		}
		l := loop{From: b.Target, To: b.Addr, Ops: map[string]int{}}
		for _, in := range ins {
			if in.Addr >= l.From && in.Addr <= l.To {
				l.Ops[in.Op]++
				l.N++
			}
		}
		if l.N >= minLen {
			ls = append(ls, l)
		}
	}
	sort.SliceStable(ls, func(i, j int) bool {
		if ls[i].From != ls[j].From {
			return ls[i].From < ls[j].From
		}
		return ls[i].N > ls[j].N
	})
	return ls
}

// summarize reports a pipeline's size and what its loops are made of.
func summarize(ins []instruction) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %d instructions\n", len(ins))
	for _, l := range loops(ins, 40) {
		ffma := 0 // FFMA with any modifiers (.FTZ, .SAT, …)
		for op, n := range l.Ops {
			if op == "FFMA" || strings.HasPrefix(op, "FFMA.") {
				ffma += n
			}
		}
		fmt.Fprintf(&b, "  loop %#x–%#x: %d instructions, %.0f %% FFMA: %s\n",
			l.From, l.To, l.N, 100*float64(ffma)/float64(l.N), topOps(l.Ops, 10))
	}
	return b.String()
}

// topOps lists the n most frequent mnemonics with their counts.
func topOps(ops map[string]int, n int) string {
	type kv struct {
		op string
		n  int
	}
	var all []kv
	for op, c := range ops {
		all = append(all, kv{op, c})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].n != all[j].n {
			return all[i].n > all[j].n
		}
		return all[i].op < all[j].op
	})
	var parts []string
	for i := 0; i < len(all) && i < n; i++ {
		parts = append(parts, fmt.Sprintf("%s %d", all[i].op, all[i].n))
	}
	return strings.Join(parts, ", ")
}
