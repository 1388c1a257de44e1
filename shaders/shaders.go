// Package shaders holds webdraft's WGSL compute kernels, one per file. Each
// file opens with what it computes, its buffer layouts, its dispatch shape
// and why its workgroup size; package kernels owns the Go side of each
// (shape checks, params, dispatch arithmetic) and tests it against its
// plain-Go twin in package reference. What several kernels share — helpers,
// params structs — is written once, in prelude.wgsl, and linked into each
// kernel that uses it (Link).
//
// The WGSL is written for two compilers: the one inside the wgpu-native
// library that github.com/cogentcore/webgpu v0.23.0 bundles (naga, early
// 2024) and the browsers'. Hence:
//   - no `override`: tuning constants are `const NAME: u32 = …;`
//     declarations that a pipeline may specialize (gpu.Specialize), and
//     sizes derived from them are consts too (array sizes must be a single
//     name or literal);
//   - no `enable f16`: f16 data is stored as u32 pairs and read with
//     unpack2x16float, which needs no shader-f16 feature;
//   - no subgroup operations: reductions go through workgroup memory;
//   - binding 0 is a uniform params struct of u32/f32 fields padded to a
//     multiple of 16 bytes (package kernels mirrors each in a Go struct, and
//     a test holds the two to the same fields); storage buffers follow at
//     bindings 1, 2, … in the order package kernels declares them. A file
//     with several entry points may give one binding a different type in
//     each (matmul_rowtile.wgsl's weights): a binding must be unique only
//     among the variables one entry point uses.
//
// And for speed: naga clamps every dynamic index into a workgroup or
// private array (min(i, len − 1)), which the driver cannot fold into a
// load's offset. In a hot loop, index workgroup arrays so that what varies
// from read to read is a constant inner index once the driver unrolls the
// loop (skinny_int4.wgsl's xs[octet][i][v], not xs[k·TV + v]), and give a
// loop whose loads should go out together a fixed count. lab/nvsass shows
// what the driver made of a kernel.
//
// And lavapipe, CI's Vulkan, ends a function's loops after 65,535
// iterations in all (llvmpipe's LP_MAX_TGSI_LOOP_ITERATIONS, shared by
// every loop of the function): an invocation that loops longer gives wrong
// results there without an error. Kernels keep an invocation's loops short
// (a row split across workgroups, not walked by one), and tests that would
// pass the limit stay within it on software adapters (TestSample).
//
// And workgroup memory is occupancy: on the H200 NVIDIA's driver fits about
// 56 KB of it an SM (8 KB a workgroup: 6 an SM; 12 KB: 4; 28 KB or more: 1;
// lab/gridsync's TestResidentWorkgroups), so a kernel's arrays share one region
// where their lifetimes allow (matvec_int4.wgsl's shm).
package shaders

import (
	"embed"
	"fmt"
	"path"
	"regexp"
	"strings"
	"sync"
)

//go:embed *.wgsl
var files embed.FS

// The kernels, each as it is compiled: its file, then the prelude items it
// uses.
var (
	// MatMulRowTile is matmul_rowtile.wgsl: out (+)= x · Wᵀ for any shape,
	// int4, f16 or f32 W (entry points int4, dense_f16, dense_f32).
	MatMulRowTile = mustModule("matmul_rowtile.wgsl")
	// MatVecInt4 is matvec_int4.wgsl: out (+)= x · Wᵀ for int4 W and T ≤ 4
	// rows.
	MatVecInt4 = mustModule("matvec_int4.wgsl")
	// MatVecBatchInt4 is matvec_batch_int4.wgsl: out (+)= x · Wᵀ for int4 W
	// and 2–4 rows, one weight row a thread.
	MatVecBatchInt4 = mustModule("matvec_batch_int4.wgsl")
	// GEMMInt4 is gemm_int4.wgsl: out (+)= x · Wᵀ for int4 W and many rows,
	// tiled in workgroup memory, optionally split along K.
	GEMMInt4 = mustModule("gemm_int4.wgsl")
	// SkinnyInt4 is skinny_int4.wgsl: out (+)= x · Wᵀ for int4 W and a few
	// to some tens of rows, weights in registers, optionally split along K.
	SkinnyInt4 = mustModule("skinny_int4.wgsl")
	// MatMulReduce is matmul_reduce.wgsl: the sum of a split-K matmul's
	// parts.
	MatMulReduce = mustModule("matmul_reduce.wgsl")
	// Embed is embed.wgsl: the embedding gather from an int4, f16 or f32
	// table (entry points int4, dense_f16, dense_f32).
	Embed = mustModule("embed.wgsl")
	// RMSNorm is rmsnorm.wgsl: RMSNorm over rows (hidden or per head).
	RMSNorm = mustModule("rmsnorm.wgsl")
	// Copy is copy.wgsl: a 16-byte-word copy.
	Copy = mustModule("copy.wgsl")
	// AdvanceRows is advance_rows.wgsl: line rows of a rows buffer moved
	// one position on (a chain's next pass, on the device).
	AdvanceRows = mustModule("advance_rows.wgsl")
	// SpecAccept is spec_accept.wgsl: a greedy speculative step accepted
	// on the device (a chain of steps, engine/webgpu's Head.DraftVerifyN).
	SpecAccept = mustModule("spec_accept.wgsl")
	// SpecRows is spec_rows.wgsl: the places of a chained speculative
	// step's rows, target's and head's, from the accepted state.
	SpecRows = mustModule("spec_rows.wgsl")
	// SpecKeys is spec_keys.wgsl: a chained speculative step's coupled
	// keys, its rows' and its drafts', from the positions it reached.
	SpecKeys = mustModule("spec_keys.wgsl")
	// SpecDraftRows is spec_draft_rows.wgsl: a standalone drafter's rows
	// in a chained speculative step, from the accepted state.
	SpecDraftRows = mustModule("spec_draft_rows.wgsl")
	// Gather is gather.wgsl: rows of words (single words, or hidden
	// states) copied between given rows of two buffers (a fused
	// speculative step's drafted tokens into the target's inputs; a
	// target's features at their cache slots; an EAGLE-3 head's rows).
	Gather = mustModule("gather.wgsl")
	// Scatter is scatter.wgsl: rows of values placed at given columns of
	// wider rows (a partial vocabulary's logits at their tokens).
	Scatter = mustModule("scatter.wgsl")
	// Argmax is argmax.wgsl: the index of each row's largest value.
	Argmax = mustModule("argmax.wgsl")
	// Sample is sample.wgsl: a verifier's read-out of rows of logits — the
	// argmax, log-probabilities, the most likely tokens and speculative
	// sampling's acceptance and draw.
	Sample = mustModule("sample.wgsl")
	// AttentionDecode is attention_decode.wgsl: split attention of single
	// query rows, each with its own mask (causal or a token tree's), over
	// the KV cache (flash-decoding).
	AttentionDecode = mustModule("attention_decode.wgsl")
	// AttentionMerge is attention_merge.wgsl: merges AttentionDecode's
	// splits.
	AttentionMerge = mustModule("attention_merge.wgsl")
	// AttentionPrefill is attention_prefill.wgsl: tiled attention of a
	// sequence's new rows over the KV cache, causal or by a token tree's
	// masks.
	AttentionPrefill = mustModule("attention_prefill.wgsl")
	// QKVRopeKV is qkv_rope_kv.wgsl: q/k norms and RoPE from the stacked
	// q/k/v projection (its rows, or its split-K partial sums, reduced on
	// the way), with the keys and values written to the rows' KV-cache
	// slots (its header documents the cache layout).
	QKVRopeKV = mustModule("qkv_rope_kv.wgsl")
	// QKVFusedInt4 is qkv_fused_int4.wgsl: input_layernorm, the stacked
	// q/k/v projection of an int4 weight and qkv_rope_kv.wgsl's work, in
	// one dispatch, a head vector of up to four rows a workgroup (layers
	// of up to 2,048 inputs, by the plan).
	QKVFusedInt4 = mustModule("qkv_fused_int4.wgsl")
	// TreeExpand is tree_expand.wgsl: one level of a token tree drafted on
	// the device — the frontier's children scored, the next frontier
	// chosen.
	TreeExpand = mustModule("tree_expand.wgsl")
	// TreeSelect is tree_select.wgsl: the nodes of a tree drafted on the
	// device that the target verifies, and their rows.
	TreeSelect = mustModule("tree_select.wgsl")
	// KVMove is kv_move.wgsl: cached keys and values copied from slot to
	// slot within sequences (a token tree's accepted path moved into
	// place).
	KVMove = mustModule("kv_move.wgsl")
)

// preludeFile holds the shared items.
const preludeFile = "prelude.wgsl"

// Modules returns every kernel of this package as it is compiled, by file
// name (the browser test compiles each with the browser's compiler).
func Modules() (map[string]string, error) {
	names, err := files.ReadDir(".")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, n := range names {
		if n.Name() == preludeFile {
			continue
		}
		src, err := files.ReadFile(n.Name())
		if err != nil {
			return nil, err
		}
		if out[n.Name()], err = Link(n.Name(), string(src)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func mustModule(name string) string {
	src, err := files.ReadFile(name)
	if err == nil {
		var linked string
		if linked, err = Link(name, string(src)); err == nil {
			return linked
		}
	}
	panic(fmt.Sprintf("shaders: %s: %v", name, err)) // a broken build: every GPU test fails on it
}

// Link returns kernel file name's source src followed by the prelude items
// it uses, directly or through other items, in the prelude's order. A
// kernel that declares a name the prelude declares is an error.
func Link(name, src string) (string, error) {
	items, err := loadPrelude()
	if err != nil {
		return "", err
	}
	code := stripComments(src)
	for _, m := range declaration.FindAllStringSubmatch(code, -1) {
		if _, ok := items.byName[m[2]]; ok {
			return "", fmt.Errorf("%s declares %s, which %s declares", name, m[2], preludeFile)
		}
	}
	refs := scanRefs(code)
	used := make([]bool, len(items.list))
	n := 0
	for grown := true; grown; { // until no item adds another
		grown = false
		for i, it := range items.list {
			if !used[i] && refs.uses(it) {
				used[i], grown = true, true
				n++
				refs.add(it.refs)
			}
		}
	}
	if n == 0 {
		return src, nil
	}
	var b strings.Builder
	b.WriteString(src)
	fmt.Fprintf(&b, "\n// ---- from %s ----\n", path.Join("shaders", preludeFile))
	for i, it := range items.list {
		if used[i] {
			b.WriteString("\n" + it.text + "\n")
		}
	}
	return b.String(), nil
}

// item is one declaration of the prelude with its comment.
type item struct {
	name, kind string
	text       string // as written, comment included
	refs       refs   // the names its code (its own declaration left out) uses
}

// refs is the names a piece of WGSL (without comments) uses: named (a
// constant, a struct, an alias — not a field, as in p.scale) and called (a
// function: the name, then an opening parenthesis).
type refs struct{ named, called map[string]bool }

// uses reports whether the code behind r uses item it.
func (r refs) uses(it item) bool {
	if it.kind == "fn" {
		return r.called[it.name]
	}
	return r.named[it.name]
}

// add adds o's names to r.
func (r refs) add(o refs) {
	for n := range o.named {
		r.named[n] = true
	}
	for n := range o.called {
		r.called[n] = true
	}
}

// scanRefs returns the names code uses: each identifier not right after a
// '.', and of those the ones followed (past spaces) by '('.
func scanRefs(code string) refs {
	r := refs{named: map[string]bool{}, called: map[string]bool{}}
	for i := 0; i < len(code); {
		c := code[i]
		if !identStart(c) && !digit(c) {
			i++
			continue
		}
		j := i + 1
		for j < len(code) && (identStart(code[j]) || digit(code[j])) {
			j++
		}
		if identStart(c) && (i == 0 || code[i-1] != '.') { // a number's suffix (2u, 1e5) is no name
			id := code[i:j]
			r.named[id] = true
			k := j
			for k < len(code) && (code[k] == ' ' || code[k] == '\t' || code[k] == '\n' || code[k] == '\r') {
				k++
			}
			if k < len(code) && code[k] == '(' {
				r.called[id] = true
			}
		}
		i = j
	}
	return r
}

func identStart(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func digit(c byte) bool { return c >= '0' && c <= '9' }

type prelude struct {
	list   []item
	byName map[string]item
}

var (
	// declaration matches a module-scope declaration at the start of a line.
	declaration = regexp.MustCompile(`(?m)^(fn|const|struct|alias)\s+([A-Za-z_][A-Za-z0-9_]*)`)
	comment     = regexp.MustCompile(`//[^\n]*`)
)

func stripComments(s string) string { return comment.ReplaceAllString(s, "") }

// loadPrelude is preludeItems, split once.
var loadPrelude = sync.OnceValues(preludeItems)

// preludeItems splits prelude.wgsl into its items: paragraphs after the
// file's opening comment, each a comment and one declaration.
func preludeItems() (prelude, error) {
	data, err := files.ReadFile(preludeFile)
	if err != nil {
		return prelude{}, err
	}
	p := prelude{byName: map[string]item{}}
	paragraphs := strings.Split(strings.TrimSpace(strings.ReplaceAll(string(data), "\r\n", "\n")), "\n\n")
	for i, text := range paragraphs[1:] {
		code := stripComments(text)
		decls := declaration.FindAllStringSubmatch(code, -1)
		if len(decls) != 1 {
			return prelude{}, fmt.Errorf("%s: paragraph %d declares %d names, want one", preludeFile, i+2, len(decls))
		}
		it := item{kind: decls[0][1], name: decls[0][2], text: text,
			// The item's own declaration is no use of it.
			refs: scanRefs(strings.Replace(code, decls[0][0], "", 1))}
		if _, dup := p.byName[it.name]; dup {
			return prelude{}, fmt.Errorf("%s declares %s twice", preludeFile, it.name)
		}
		p.list = append(p.list, it)
		p.byName[it.name] = it
	}
	return p, nil
}
