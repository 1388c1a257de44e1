package webgpu

import (
	"fmt"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/sampling"
	"webdraft/treemask"
)

// pending is an entry's tokens not yet fed, with how each is placed in its
// sequence's cache, and the rows read out of the passes that fed the ones
// before.
type pending struct {
	entry  *engine.Entry       // Step's entry; nil for Verify's
	verify *engine.VerifyEntry // Verify's entry; nil for Step's
	seq    *kernels.KVSeq
	tokens []int
	place  []treemask.Row     // tokens' positions and masks (KVSeq.Place): line tokens or tree nodes
	out    int                // how many of tokens' last positions are read out
	rows   []engine.VerifyRow // read out so far, in order
	// slots are the Q-store slots of a Verify entry's sampled drafts, by
	// read-out row (−1: none): where a proposing row's q goes, or a tree
	// node's q is read from (sampledDrafts).
	slots []int
}

// readsOut reports how many of the first T pending tokens are read out.
func (p *pending) readsOut(T int) int { return max(0, T-(len(p.tokens)-p.out)) }

// sampled reports whether p's rows need sample.wgsl: a draw or a top-N.
func (p *pending) sampled() bool {
	return p.topN() > 0 || p.verify != nil && !p.verify.Sampling.Greedy()
}

// topN is how many most likely tokens p's rows list.
func (p *pending) topN() int {
	if p.verify != nil {
		return p.verify.TopN
	}
	return p.entry.TopN
}

// readsOutWith notes in ps what reading out p's rows takes (outs of
// them).
func (ps *pass) readsOutWith(p *pending, outs int) {
	if p.sampled() {
		ps.sample = true
		ps.topN = max(ps.topN, p.topN())
	}
	if p.proposes() {
		for j := range outs {
			if len(p.verify.Propose[len(p.rows)+j]) > 0 {
				ps.propose = true
			}
		}
	}
	if p.walks() {
		ps.trees++
		ps.path = max(ps.path, p.out-1)
	}
}

// passEntry is one sequence's part of a forward pass: rows row0 … row0+T-1
// hold its positions (cache slots) P … P+T-1, placed by the first T of
// its pending place, and the last outs of them are read out into the
// pass's read-out rows out0 … out0+outs-1.
type passEntry struct {
	p          *pending
	row0, T    int
	P          int
	out0, outs int
	complete   bool // the entry's last pending token is fed
}

// pass is one forward pass.
type pass struct {
	entries []passEntry
	rows    int
	decode  int  // rows 0 … decode-1 are single-token entries (decode attention)
	lasts   int  // rows read out
	sample  bool // read out through sample.wgsl, else argmax.wgsl
	topN    int  // the most likely tokens each read-out row lists (sample)
	maxLen  int  // the longest context a decode-attention row sees
	// Sampled drafts (sampled.go): some read-out row draws proposals
	// (propose.wgsl); trees are walked (tree_walk.wgsl), each record
	// holding a path of up to path nodes.
	propose     bool
	trees, path int
	chained     bool // a pass of StepN's chain: its read-out is not read back (readRows)
	// coupled: the read-out's greedy rows are coupled drafts, keyed by the
	// activations' keys (a fused call's drafter passes: couple.go); with
	// sample, sample.wgsl lists their top tokens and argmax.wgsl draws them.
	coupled bool
	// outcome: sampled read-out rows write what they sampled, not their
	// argmax, into next (kernels.SetSampleOutcome): a sampled chain's
	// passes, whose next pass embeds it, and the verifications of chained
	// speculative steps, which accept by it.
	outcome bool
	// sameLasts: the pass reads out the rows the pass before it did (a
	// chain's decode passes after the first), which stay on the device.
	sameLasts bool
	// fromNext: the pass's input ids are the greedy tokens the pass before
	// it read out, in next (a chain's passes after the first: one row an
	// entry, in the order of their read-out rows).
	fromNext bool
	// keep, where set, also copies each feature layer's rows to where an
	// EAGLE-3 head's next pass reads them (a chained speculative step:
	// Head.DraftVerifyN).
	keep *featureKeep
}

// featureKeep is where a pass's rows' features go beside the cache: row
// r's feature f to row pairs[f]'s destination for r of buf (gather.wgsl's
// pairs, one binding a feature layer).
type featureKeep struct {
	buf   *gpu.Buffer
	pairs []gpu.Binding
}

// decodeEntryRows is the most tokens an entry may feed through decode
// attention, each row attending on its own, rather than through prefill
// tiles: a verification of a token tree's 64 nodes (treemask.MaxNodes), or
// of as many drafted tokens, after the line's last token. It then shares
// the pass's one decode-attention dispatch instead of adding one a layer,
// and prefill's few tiles spread poorly: on the H200, 16 to 64 rows of one
// sequence after 1,024 positions take 340–365 µs a layer in prefill
// tiles, 32 decode rows of as many such sequences 65 µs
// (BenchmarkAttentionPrefill, BenchmarkAttentionDecode).
const decodeEntryRows = treemask.MaxNodes + 1

// plan picks the next forward pass from what is pending: short entries
// first, whole (they share one decode-attention dispatch), then chunks of
// prompts, within MaxRows rows and the read-out rows' buffers.
func (e *Engine) plan(work []pending) pass {
	var ps pass
	rows := e.opts.MaxRows
	add := func(p *pending, T int) {
		pe := passEntry{p: p, row0: ps.rows, T: T, P: p.seq.Len(), out0: ps.lasts, outs: p.readsOut(T), complete: T == len(p.tokens)}
		ps.lasts += pe.outs
		if pe.outs > 0 {
			ps.readsOutWith(p, pe.outs)
		}
		ps.entries = append(ps.entries, pe)
		ps.rows += T
		rows -= T
	}
	short := make([]bool, len(work))
	for i := range work {
		p := &work[i]
		if T := len(p.tokens); T > 0 && T <= decodeEntryRows && T <= rows && ps.lasts+p.readsOut(T) <= e.act.maxLasts {
			add(p, T)
			short[i] = true
		}
	}
	ps.decode = ps.rows
	for i := range work {
		p := &work[i]
		if short[i] || len(p.tokens) == 0 || rows == 0 {
			continue
		}
		T := min(len(p.tokens), rows)
		if room := e.act.maxLasts - ps.lasts; p.readsOut(T) > room {
			T = len(p.tokens) - p.out + room // the rows read out that fit; the rest next pass
		}
		if n := p.readsOut(T); p.walks() && n > 0 && n < p.out {
			T = len(p.tokens) - p.out // a tree's rows are walked in one pass: the next
		}
		if T > 0 {
			add(p, T)
		}
	}
	e.attentionRows(&ps)
	return ps
}

// decodePass is the j-th pass (j ≥ 1) of a chain of m over work
// (chainSubmit): every entry one row, a line token at slot base[i]+j whose
// id the pass before wrote on the device. Every decode pass of the chain
// attends as if to the longest context of its last, so that all of them
// run the same kernels.
func decodePass(work []pending, base []int, j, m int) pass {
	ps := pass{rows: len(work), decode: len(work), lasts: len(work), chained: true, fromNext: true}
	for i := range work {
		p := &work[i]
		p.tokens, p.out = nil, 1
		p.place = []treemask.Row{treemask.LineRow(base[i] + j)}
		pe := passEntry{p: p, row0: i, T: 1, P: base[i] + j, out0: i, outs: 1, complete: true}
		ps.readsOutWith(p, 1)
		ps.entries = append(ps.entries, pe)
		ps.maxLen = max(ps.maxLen, base[i]+m)
	}
	return ps
}

// attentionRows sets the pass's decode rows and longest context: where
// the prefill kernel does not take the head_dim, every row goes through
// decode attention.
func (e *Engine) attentionRows(ps *pass) {
	if !e.kv.PrefillSupported() {
		ps.decode = ps.rows
	}
	for _, pe := range ps.entries {
		if pe.row0 < ps.decode {
			ps.maxLen = max(ps.maxLen, pe.P+pe.T)
		}
	}
}

// forward records and submits one pass: its inputs (writeInputs), then the
// KV moves of paths kept since the pass before (KVCache.RecordMoves), pre
// (which may overwrite inputs on the device), its kernels and after them
// extra, in command buffers of about every dispatches.
func (e *Engine) forward(ps pass, continues bool, pre, extra []step, every int) error {
	_, err := e.forwardRead(ps, continues, pre, extra, every, nil)
	return err
}

// forwardRead is forward followed by a read of the ranges read returns
// (called once the inputs are written, as they may place the read-out)
// with the pass's last command buffer (submitRead); read nil reads nothing.
func (e *Engine) forwardRead(ps pass, continues bool, pre, extra []step, every int, read func() []gpu.Binding) ([][]byte, error) {
	if err := e.writeInputs(ps, continues); err != nil {
		return nil, err
	}
	moves := func(b *gpu.Batch) error { return e.kv.RecordMoves(b) }
	kernelSteps, keep := e.passKernels(ps)
	steps := append(append([]step{moves}, pre...), kernelSteps...)
	var ranges []gpu.Binding
	if read != nil {
		ranges = read()
	}
	raw, err := e.submitRead(append(steps, extra...), every, ranges...)
	if err != nil {
		return nil, fmt.Errorf("forward pass: %w", err)
	}
	keep()
	return raw, nil
}

// writeInputs writes what pass ps reads from the host, through the queue:
// its block tables and per-row inputs — all but the token ids when it
// continues a chain (those the pass before wrote on the device) —, the
// feature layers' rows and the read-out's sampling inputs.
func (e *Engine) writeInputs(ps pass, continues bool) error {
	a := e.act
	seqs := make([]*kernels.KVSeq, len(ps.entries))
	ids, rows := make([]uint32, ps.rows), make([]uint32, ps.rows*kernels.RowWords)
	lasts := make([]uint32, ps.lasts)
	for i, pe := range ps.entries {
		seqs[i] = pe.p.seq
		for t := range pe.T {
			r := pe.row0 + t
			if !continues {
				ids[r] = uint32(pe.p.tokens[t])
			}
			kernels.PutRow(rows[r*kernels.RowWords:], pe.p.seq.Slot(), pe.P+t, pe.p.place[t])
		}
		for j := range pe.outs {
			lasts[pe.out0+j] = uint32(pe.row0 + pe.T - pe.outs + j)
		}
	}
	if err := e.kv.SyncTables(seqs); err != nil {
		return err
	}
	if len(e.features) > 0 {
		if err := e.writeFeaturePairs(ps); err != nil {
			return err
		}
	}
	if ps.sample {
		if !ps.chained {
			if err := e.act.ensureReadout(e.dev, ps, e.layout(ps)); err != nil {
				return err
			}
		}
		if err := e.writeDraws(ps); err != nil {
			return err
		}
	}
	if ps.propose || ps.trees > 0 {
		if err := e.writeSampled(ps); err != nil {
			return err
		}
	}
	// Queue writes are ordered with submissions: this pass reads these
	// inputs, the passes before it theirs.
	for _, up := range []struct {
		buf  *gpu.Buffer
		v    []uint32
		skip bool
	}{{a.ids, ids, continues}, {a.rows, rows, false}, {a.last, lasts, ps.sameLasts}} {
		if len(up.v) > 0 && !up.skip {
			if err := up.buf.WriteU32(0, up.v); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeFeaturePairs writes where each row of pass ps keeps its features:
// its slot's pool row, for the feature layers' GatherRows.
func (e *Engine) writeFeaturePairs(ps pass) error {
	pairs := make([]uint32, ps.rows*kernels.GatherPairWords)
	for _, pe := range ps.entries {
		for t := range pe.T {
			row, err := pe.p.seq.PoolRow(pe.P + t)
			if err != nil {
				return err
			}
			r := pe.row0 + t
			pairs[2*r], pairs[2*r+1] = uint32(row), uint32(r)
		}
	}
	return e.act.featPairs.WriteU32(0, pairs)
}

// writeDraws writes the inputs of sample.wgsl for a pass's read-out rows:
// each Verify row's draw and sampling parameters — no proposal for a row
// that draws proposals, and a tree node's v for its row — ; Step's rows
// are greedy.
func (e *Engine) writeDraws(ps pass) error {
	draws := make([]uint32, ps.lasts*kernels.SampleDrawWords)
	temps := make([]float32, ps.lasts*kernels.SampleTempWords)
	for _, pe := range ps.entries {
		for j := range pe.outs {
			var p sampling.Params
			d := sampling.Draw{X: sampling.NoProposal}
			if v := pe.p.verify; v != nil && !v.Sampling.Greedy() {
				p = v.Sampling
				switch jj := len(pe.p.rows) + j; {
				case v.Tree != nil:
					d.V = v.Tree.Nodes[jj].V
				case v.Propose == nil:
					d = v.Draws[jj]
				}
			}
			r := pe.out0 + j
			kernels.PutSampleRow(draws[r*kernels.SampleDrawWords:], temps[r*kernels.SampleTempWords:], p, d)
			if ps.outcome {
				kernels.SetSampleOutcome(draws[r*kernels.SampleDrawWords:])
			}
		}
	}
	if err := e.act.draws.WriteU32(0, draws); err != nil {
		return err
	}
	return e.act.temps.WriteF32(0, temps)
}

// readOut takes in a submitted pass's read-out rows, read back (raw:
// rowsRange's bytes; nil when the pass reads nothing out): each entry's
// sequence now holds the positions it fed (tree nodes among them join its
// tree), its pending tokens advance and its rows grow by those read out; a
// complete Step entry's Next is its greedy token.
func (e *Engine) readOut(ps pass, raw []byte) error {
	rows, drawn, walk, err := e.readRows(ps, raw)
	if err != nil {
		return err
	}
	t := 0 // the tree walked next
	for _, pe := range ps.entries {
		if pe.p.proposes() || pe.p.walks() && pe.outs > 0 {
			if err := e.readSampled(pe, rows[pe.out0:pe.out0+pe.outs], drawn, walk, ps, t); err != nil {
				return fmt.Errorf("forward pass: batch entry's %w", err)
			}
			if pe.p.walks() {
				t++
			}
		}
		if err := pe.p.seq.Commit(pe.P+pe.T, pe.p.place[:pe.T]); err != nil {
			return err
		}
		pe.p.tokens, pe.p.place = pe.p.tokens[pe.T:], pe.p.place[pe.T:]
		pe.p.out -= pe.outs
		pe.p.rows = append(pe.p.rows, rows[pe.out0:pe.out0+pe.outs]...)
		if pe.complete && pe.p.entry != nil {
			last := pe.p.rows[len(pe.p.rows)-1]
			pe.p.entry.Next, pe.p.entry.Logprob, pe.p.entry.Top = last.Argmax, last.ArgmaxLogprob, last.Top
		}
	}
	return nil
}

// readRows decodes the pass's read-out rows (raw: rowsRange's bytes): from
// argmax.wgsl, the greedy token, its log-probability and the row's
// log-sum-exp; from sample.wgsl, all it wrote, and with it in the same
// read (readLayout) the words of the proposals drawn and of the trees
// walked.
func (e *Engine) readRows(ps pass, raw []byte) (rows []engine.VerifyRow, drawn, walk []uint32, err error) {
	a := e.act
	rows = make([]engine.VerifyRow, ps.lasts)
	if ps.lasts == 0 {
		return rows, nil, nil, nil
	}
	if !ps.sample {
		ids, lps := nextWords(raw, a.nextLP, ps.lasts)
		_, lses := nextWords(raw, a.nextLP+uint64(lseAt(ps.lasts))*4, ps.lasts)
		for r := range rows {
			if rows[r].Argmax, err = e.token(ids[r]); err != nil {
				return nil, nil, nil, fmt.Errorf("forward pass: %w", err)
			}
			rows[r].ArgmaxLogprob, rows[r].LogSumExp = lps[r], lses[r]
		}
		return rows, nil, nil, nil
	}
	l := e.layout(ps)
	words := u32s(raw)
	at := func(off, bytes uint64) []uint32 { return words[off/4 : (off+bytes)/4] }
	var top []uint32
	if ps.topN > 0 {
		top = at(l.top, l.topBytes)
	}
	if ps.propose {
		drawn = at(l.drawn, l.drawnBytes)
	}
	if ps.trees > 0 {
		walk = at(l.walk, l.walkBytes)
	}
	for r := range rows {
		if rows[r].Row, err = kernels.SampleRow(words[r*kernels.SampleWords:]); err != nil {
			return nil, nil, nil, fmt.Errorf("forward pass: %w", err)
		}
		if ps.topN > 0 {
			rows[r].Top = kernels.SampleTop(top[r*ps.topN*2:], ps.topN)
		}
	}
	for _, pe := range ps.entries { // each entry lists its own top-N
		for j := range pe.outs {
			r := &rows[pe.out0+j]
			r.Top = r.Top[:pe.p.topN()]
			if len(r.Top) == 0 {
				r.Top = nil
			}
		}
	}
	return rows, drawn, walk, nil
}

// rowsRange is what readRows reads back after pass ps: argmax.wgsl's
// tokens, log-probabilities and log-sum-exps in next, or all that
// sample.wgsl and the sampled drafts' kernels gathered (readLayout).
func (e *Engine) rowsRange(ps pass) gpu.Binding {
	a := e.act
	if !ps.sample {
		return a.next.Slice(0, a.nextLP+uint64(lseAt(ps.lasts)+ps.lasts)*4)
	}
	return a.sampled.Slice(0, e.layout(ps).size)
}

// token checks a greedy token read back: argmax.wgsl writes ArgmaxNaN for
// logits that hold a NaN.
func (e *Engine) token(id uint32) (int, error) {
	if id == kernels.ArgmaxNaN || int(id) >= e.cfg.VocabSize {
		return 0, fmt.Errorf("the logits hold NaN (token %d)", id)
	}
	return int(id), nil
}

// submitEvery is how many dispatches a pass the host waits for records
// before it submits them: the GPU starts on the first layers while the
// host records the rest (on the H200 host recording costs several µs of
// CPU a dispatch). chainedSubmitEvery is the same for the passes of a
// chain after its first (StepN), which go together (chainRest): fewer,
// longer command buffers, since each submission costs the GPU time and a
// browser's host more, while a single step waited for is quicker in
// shorter ones. Both keep command buffers within what lavapipe handles
// (it has crashed on one of ~560 dispatches with distinct bind groups),
// and on lavapipe chains go in buffers of submitEvery too (lavapipeEvery):
// there a test's chains of sampled passes, buffers of up to 256
// dispatches, crashed the process now and then.
const (
	submitEvery        = 48
	chainedSubmitEvery = 256
)

// chainedEvery is chainedSubmitEvery, or submitEvery on lavapipe.
func (e *Engine) chainedEvery() int {
	if e.dev.Class() == gpu.ClassLavapipe {
		return submitEvery
	}
	return chainedSubmitEvery
}

// step records one operation into a batch.
type step func(b *gpu.Batch) error

// submit records steps into batches of about every dispatches, submitting
// each as soon as it is full; the queue runs them in order.
func (e *Engine) submit(steps []step, every int) error {
	_, err := e.submitRead(steps, every)
	return err
}

// submitRead is submit, the last batch reading ranges back as it is
// submitted (gpu.Batch.SubmitRead): the read costs no submission of its
// own. It returns each range's bytes.
func (e *Engine) submitRead(steps []step, every int, ranges ...gpu.Binding) ([][]byte, error) {
	b, err := e.newBatch()
	if err != nil {
		return nil, err
	}
	for _, st := range steps {
		if err := st(b); err != nil {
			b.Discard()
			return nil, err
		}
		if b.Len() >= every {
			if err := e.submitBatch(b); err != nil {
				return nil, err
			}
			if b, err = e.newBatch(); err != nil {
				return nil, err
			}
		}
	}
	if len(ranges) == 0 {
		return nil, e.submitBatch(b)
	}
	if e.profile != nil { // the profile's timestamps are read after the batch
		if err := e.submitBatch(b); err != nil {
			return nil, err
		}
		return gpu.ReadRanges(ranges...)
	}
	return b.SubmitRead(ranges...)
}

func (e *Engine) newBatch() (*gpu.Batch, error) {
	b, err := e.dev.NewBatch("forward")
	if err != nil || e.profile == nil {
		return b, err
	}
	if err := b.Profile(chainedSubmitEvery + 1024); err != nil { // a step may record many dispatches (a prompt's attention each)
		b.Discard()
		return nil, err
	}
	return b, nil
}

func (e *Engine) submitBatch(b *gpu.Batch) error {
	if err := b.Submit(); err != nil || e.profile == nil {
		return err
	}
	p, err := b.Results()
	e.profile.Add(p)
	return err
}

// kernels lists the forward pass's operations: modeling_qwen3.py, step by
// step. R = rows of the pass, H hidden, D head_dim.
func (e *Engine) kernels(ps pass) []step {
	c, a, w := &e.cfg, e.act, e.w
	R := ps.rows
	heads, eps := c.NumAttentionHeads, c.RMSNormEps
	steps := []step{
		// hidden = embed_tokens(input_ids): (R, H)
		func(b *gpu.Batch) error {
			if ps.fromNext {
				return kernels.Embed(b, a.x, a.next.All(), w.embed, R)
			}
			return kernels.Embed(b, a.x, a.ids.All(), w.embed, R)
		},
	}
	for l := range w.layers {
		lw := &w.layers[l]
		if f := e.featureAt[l]; f >= 0 {
			// A layer whose input the sequences keep: hidden into each
			// row's slot of feature buffer f, and where the pass keeps
			// them for a head, into its rows there too.
			steps = append(steps, func(b *gpu.Batch) error {
				pairs := a.featPairs.Slice(0, uint64(R*kernels.GatherPairWords)*4)
				if ps.keep != nil {
					return kernels.GatherRowsTwice(b, e.kv.Feature(f), ps.keep.buf, a.x, pairs, ps.keep.pairs[f], R, c.HiddenSize)
				}
				return kernels.GatherRows(b, e.kv.Feature(f), a.x, pairs, R, c.HiddenSize)
			})
		}
		// One decode row: its attention block in kernels.AttentionBlockDecode
		// (through o_proj), which may fold the norms, RoPE and the cache
		// append into attention, and attention's merge into o_proj.
		oneRow := R == 1 && ps.decode == 1
		steps = append(steps,
			// q | k | v = qkv_proj(input_layernorm(hidden)): (R, (heads + 2·kv_heads)·D);
			// q = rope(q_norm(q)); past_key_values.update(rope(k_norm(k)), v)
			func(b *gpu.Batch) error {
				if oneRow {
					return kernels.AttentionBlockDecode(b, a.x, a.attn, a.q, a.qkv, lw.inputNorm, lw.qkv, lw.o, lw.qkNormRope, e.kv, l, a.rows, heads, ps.maxLen, eps)
				}
				return kernels.QKVProjRopeKV(b, a.q, a.qkv, a.x, lw.inputNorm, lw.qkv, lw.qkNormRope, e.kv, l, a.rows, R, heads, eps)
			},
			// attn = softmax(q·kᵀ/√D + mask)·v, the mask causal or a token
			// tree's: decode rows together, prompts tiled
			func(b *gpu.Batch) error {
				if ps.decode == 0 || oneRow {
					return nil
				}
				return kernels.AttentionDecode(b, a.attn, a.q, e.kv, l, a.rows, ps.decode, heads, ps.maxLen)
			},
			func(b *gpu.Batch) error {
				for _, pe := range ps.entries {
					if pe.row0 >= ps.decode {
						if err := kernels.AttentionPrefill(b, a.attn, a.q, e.kv, l, pe.p.seq.Slot(), a.rows, pe.row0, pe.T, heads); err != nil {
							return err
						}
					}
				}
				return nil
			},
			// hidden += o_proj(attn)
			func(b *gpu.Batch) error {
				if oneRow {
					return nil
				}
				return kernels.MatMul(b, a.x, a.attn, lw.o, R, true)
			},
			// hidden += down_proj(silu(gate_proj(h)) * up_proj(h)), h = post_attention_layernorm(hidden)
			func(b *gpu.Batch) error { return kernels.MatMulNorm(b, a.gateUp, a.x, lw.postNorm, lw.gateUp, R, eps) },
			func(b *gpu.Batch) error { return kernels.MatMulSwiGLU(b, a.x, a.gateUp, lw.down, R, true) },
		)
	}
	if ps.lasts > 0 {
		steps = append(steps,
			// The rows read out: norm, lm_head, argmax (or sample). The
			// vocabulary-sized head normalizes first: its thousands of
			// workgroups would each normalize the rows again.
			func(b *gpu.Batch) error {
				return kernels.RMSNormRows(b, a.hNorm, a.x, a.last, w.norm, ps.lasts, R, c.HiddenSize, eps)
			},
			func(b *gpu.Batch) error {
				if w.headTokens == nil {
					return kernels.MatMul(b, a.logits, a.hNorm, w.head, ps.lasts, false)
				}
				// A head over part of the vocabulary scores its tokens: the
				// greedy choice maps them to the vocabulary's (ArgmaxOf);
				// sampling places them among the −∞ of the rest.
				if err := kernels.MatMul(b, a.headLogits, a.hNorm, w.head, ps.lasts, false); err != nil {
					return err
				}
				if !ps.sample {
					return nil
				}
				return kernels.Scatter(b, a.logits, a.headLogits, w.headTokens, ps.lasts, w.headRows, c.VocabSize)
			},
			func(b *gpu.Batch) error {
				var keys gpu.Binding
				if ps.coupled {
					keys = a.keys.Slice(0, uint64(ps.lasts*kernels.ArgmaxCoupledWords)*4)
				}
				if ps.sample {
					if err := kernels.Sample(b, a.sampled, a.top, a.next, a.lp(), a.logits, a.draws, a.temps, ps.lasts, c.VocabSize, ps.topN); err != nil {
						return err
					}
					if !ps.coupled {
						return nil
					}
					// Coupled drafts that list their top tokens: sample.wgsl
					// lists them, argmax.wgsl's coupled rows draw the drafts
					// over its ids.
				}
				if w.headTokens != nil {
					return kernels.ArgmaxOfCoupled(b, a.next.All(), a.lp(), a.headLogits, w.headTokens, keys, ps.lasts, w.headRows, lseAt(ps.lasts))
				}
				return kernels.ArgmaxCoupled(b, a.next.All(), a.lp(), a.logits, keys, ps.lasts, c.VocabSize, lseAt(ps.lasts))
			},
		)
		if ps.sample && !ps.chained {
			// Proposals drawn, trees walked; what they and sample.wgsl
			// wrote gathered for one read.
			steps = append(steps, e.sampledKernels(ps, e.layout(ps))...)
		}
	}
	return steps
}

func u32s(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24
	}
	return out
}
