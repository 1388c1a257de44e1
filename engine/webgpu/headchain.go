package webgpu

import (
	"context"
	"fmt"
	"math"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/sampling"
	"webdraft/treemask"
)

// StepN is n Steps in one (engine.Chainer): the first feeds each entry's
// tokens, as Step does, and each after it one row an entry — its token the
// step before's argmax in the target's vocabulary, chosen so on the device
// (kernels.ArgmaxOf over headWeights.targetIDs; where entries ask for top
// tokens, sample.wgsl's draft token mapped by two gathers), its hidden the
// head's output at the row before, left in place by the step before. The
// first step's passes are submitted as Step's are, every later step
// recorded after them with no host input of its own (the rows' places
// written ahead, a buffer a step), and each step's argmax, log-probability
// and top tokens copied to a results buffer that one read brings back at
// the end. The caches then
// hold the entries' tokens and the first n−1 drafted; entry.Next is the
// last; entries' Tokens are left as they were. A batch that Step refuses,
// or that n−1 more tokens would take past the context or the cache, is
// refused before anything runs.
//
// Where the rows of the steps after the first would read the target's
// features (an entry fed short of the target's line) or the batch
// outnumbers a pass's rows, the steps run one by one, each read back, as
// engine.StepN runs them.
func (h *Head) StepN(ctx context.Context, batch []*engine.Entry, n int) ([][]engine.Token, error) {
	if n <= 0 {
		return nil, fmt.Errorf("webgpu head: step n: n = %d, want > 0", n)
	}
	if err := engine.CheckBatch(&h.engCfg, batch); err != nil {
		return nil, fmt.Errorf("webgpu head: %w", err)
	}
	out := make([][]engine.Token, len(batch))
	if len(batch) == 0 {
		return out, nil
	}
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return nil, err
	}
	feeds, err := h.prepareChain(ctx, batch, n)
	if err != nil {
		return nil, err
	}
	return h.runChain(ctx, feeds, batch, n)
}

// prepareChain plans n steps over batch (checked, the group's lock held)
// and reserves the head's blocks for them; nothing changes when it fails.
func (h *Head) prepareChain(ctx context.Context, batch []*engine.Entry, n int) ([]headFeed, error) {
	feeds, err := h.stepFeeds(batch)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	seqs, need := make([]*kernels.KVSeq, len(feeds)), make([]int, len(feeds))
	for i, f := range feeds {
		if p := f.L + len(f.tokens) + n - 1; p > h.engCfg.MaxPositionEmbeddings {
			return nil, fmt.Errorf("webgpu head: batch entry %d: %d positions: %w (max_position_embeddings %d)", i, p, engine.ErrContextFull, h.engCfg.MaxPositionEmbeddings)
		}
		seqs[i], need[i] = f.seq.kv, f.L+len(f.tokens)-1+n-1
	}
	if err := h.kv.Reserve(seqs, need); err != nil {
		return nil, fmt.Errorf("webgpu head: %w", kvError(err))
	}
	return feeds, nil
}

// runChain runs the n steps of prepared feeds: chained on the device and
// read back once where they chain, else step by step, each read back.
func (h *Head) runChain(ctx context.Context, feeds []headFeed, batch []*engine.Entry, n int) ([][]engine.Token, error) {
	if n > 1 && h.chains(feeds) {
		return h.chainTokens(ctx, feeds, batch, n, nil)
	}
	// Step by step, each read back.
	out := make([][]engine.Token, len(batch))
	tokens := make([][]int, len(batch))
	for i, en := range batch {
		tokens[i] = en.Tokens
	}
	defer func() {
		for i, en := range batch {
			en.Tokens = tokens[i]
		}
	}()
	for range n {
		if err := h.step(ctx, batch); err != nil {
			return nil, err
		}
		for i, en := range batch {
			out[i] = append(out[i], engine.Token{ID: en.Next, Logprob: en.Logprob, Top: en.Top})
			en.Tokens = []int{en.Next}
		}
	}
	return out, nil
}

// chainTokens runs a chain of n steps over planned feeds (chains, or n =
// 1; the blocks reserved), its drafts coupled by keys where keys is not
// nil (chainSubmit), reads it back and commits it: each entry's n tokens.
// A chain that fails is undone and breaks the engine.
func (h *Head) chainTokens(ctx context.Context, feeds []headFeed, batch []*engine.Entry, n int, keys func(k int) gpu.Binding) ([][]engine.Token, error) {
	lay, submitted, err := h.chainSubmit(ctx, feeds, batch, n, false, keys)
	var toks [][]engine.Token
	if err == nil {
		var raw []byte
		if raw, err = h.act.results.Read(0, lay.bytes()); err != nil {
			err = fmt.Errorf("read back: %w", err)
		} else {
			toks, err = h.chainDone(feeds, batch, lay, raw)
		}
	}
	if err != nil {
		h.unchain(feeds, submitted)
		return nil, h.target.broken(err)
	}
	return toks, nil
}

// unchain undoes a chain that failed: the blocks reserved for it given
// back and, once any of it went to the device, the store's rows forgotten.
func (h *Head) unchain(feeds []headFeed, submitted bool) {
	for _, f := range feeds {
		f.seq.kv.Truncate(f.seq.rows())
		if submitted {
			f.seq.outRow = -1
		}
	}
}

// chains reports whether the steps after the first of planned feeds chain
// on the device: every row they compute reads the head's output at the
// row before (none the target's features), and one pass holds a row an
// entry.
func (h *Head) chains(feeds []headFeed) bool {
	if len(feeds) > h.act.R {
		return false
	}
	for _, f := range feeds {
		if f.L+len(f.tokens)-1 < f.target.Line() {
			return false
		}
	}
	return true
}

// chainLayout is where a chain's results buffer holds each step's words:
// at step j's offset j·stride, the argmax ids (B u32) — the target's tokens
// where mapped (a chain without top tokens, or of coupled drafts:
// kernels.ArgmaxOf, which writes them there itself, and the step after
// embeds them from there), else draft tokens —, from lpAt their
// log-probabilities (B f32, then where mapped their log-sum-exps), from
// tidAt (where the chain keeps them for a target's pass and they are draft
// tokens: tidAt > 0) the target's tokens (B u32), from topAt the top tokens
// (B, topN, 2) u32 where topN > 0; each part at an offset a binding takes.
type chainLayout struct {
	stride, lpAt, tidAt, topAt uint64
	idBytes, topBytes          uint64
	topN, B, n                 int
	mapped                     bool
}

// bytes is the results' length: n steps.
func (l chainLayout) bytes() uint64 { return uint64(l.n) * l.stride }

// targetWord is the u32 word of the results that holds entry i's draft of
// step j in the target's vocabulary: its id where mapped, else at tidAt
// (a chain submitted with targets).
func (l chainLayout) targetWord(i, j int) int {
	if l.mapped {
		return int(uint64(j)*l.stride/4) + i
	}
	return int((uint64(j)*l.stride+l.tidAt)/4) + i
}

// chainLayout lays out the results of a chain of n steps over B entries
// whose rows list topN most likely tokens, keeping the drafts in the
// target's vocabulary too where targets asks and they are draft tokens;
// coupled: the chain drafts coupled draws (couple.go).
func (h *Head) chainLayout(B, topN, n int, targets, coupled bool) chainLayout {
	align := uint64(h.dev.Limits().MinStorageBufferOffsetAlignment)
	up := func(n uint64) uint64 { return (n + align - 1) / align * align }
	lay := chainLayout{topN: topN, B: B, n: n, mapped: topN == 0 || coupled}
	lay.idBytes = uint64(B*4+15) &^ 15
	lay.topBytes = uint64(B*topN*2*4+15) &^ 15
	lay.lpAt = h.act.nextLP                         // as in next: one copy takes the ids and their log-probabilities
	lay.topAt = lay.lpAt + up(uint64(lseAt(B)+B)*4) // the log-probabilities, the log-sum-exps
	if targets && !lay.mapped {
		lay.tidAt = lay.topAt
		lay.topAt += up(lay.idBytes)
	}
	lay.stride = lay.topAt
	if topN > 0 {
		lay.stride += up(lay.topBytes)
	}
	return lay
}

// chainTail is the tail of a chain's step j: its read-out words into the
// results (but where mapped: written there) and, where its argmax is a
// draft token and mapIDs, that mapped to target tokens into ids — for the
// step after, and into the results where they keep them (tidAt).
func (h *Head) chainTail(lay chainLayout, j int, mapIDs bool) []step {
	a, B := h.act, lay.B
	at := uint64(j) * lay.stride
	var steps []step
	if !lay.mapped {
		steps = append(steps, func(b *gpu.Batch) error { return kernels.CopyTo(b, a.results, at, a.next, lay.lpAt+lay.idBytes) })
	}
	if lay.topN > 0 {
		steps = append(steps, func(b *gpu.Batch) error {
			return kernels.CopyTo(b, a.results, at+lay.topAt, a.top, lay.topBytes)
		})
	}
	if !lay.mapped && mapIDs {
		steps = append(steps,
			func(b *gpu.Batch) error { return kernels.Gather(b, a.mapPairs, a.next, a.mapSrc, B) },
			func(b *gpu.Batch) error { return kernels.Gather(b, a.ids, h.w.targetIDs, a.mapPairs, B) },
		)
	}
	if lay.tidAt > 0 {
		steps = append(steps, func(b *gpu.Batch) error {
			return kernels.CopyTo(b, a.results, at+lay.tidAt, a.ids, lay.idBytes)
		})
	}
	return steps
}

// chainSubmit submits the n steps of planned feeds (chains; the blocks
// reserved) to the device, each step's read-out words copied into the
// results and, with targets, each step's drafts in the target's
// vocabulary too where the ids are draft tokens (chainLayout.tidAt), for a
// target's pass to gather (chainLayout.targetWord). Where keys is not nil,
// step j's drafts are coupled by keys(j)'s (couple.go), and the chain is
// mapped.
// Nothing is read back or committed: chainDone does that with the
// results. submitted reports whether any pass went to the device.
func (h *Head) chainSubmit(ctx context.Context, feeds []headFeed, batch []*engine.Entry, n int, targets bool, keys func(k int) gpu.Binding) (_ chainLayout, submitted bool, err error) {
	a, B := h.act, len(feeds)
	topN := 0
	seqs := make([]*kernels.KVSeq, B)
	for i, f := range feeds {
		seqs[i] = f.seq.kv
		topN = max(topN, min(batch[i].TopN, h.cfg.DraftVocabSize))
	}
	lay := h.chainLayout(B, topN, n, targets, keys != nil)
	if err := a.ensureChain(h.dev, n-1, lay.bytes()); err != nil {
		return lay, false, err
	}
	if err := h.kv.SyncTables(seqs); err != nil {
		return lay, false, err
	}
	// direct points a mapped chain's step j at its words in the results,
	// where its read-out writes them, and at the step before's ids, which
	// it embeds.
	direct := func(ps *headPass, j int) {
		if !lay.mapped {
			return
		}
		if keys != nil {
			ps.keys = keys(j)
		}
		at := uint64(j) * lay.stride
		ps.readIDs = a.results.Slice(at, lay.idBytes)
		ps.readLP = a.results.Slice(at+lay.lpAt, lay.topAt-lay.lpAt)
		if j > 0 {
			ps.fromIDs = a.results.Slice(at-lay.stride, lay.idBytes)
		}
	}
	tail := func(j int) []step { return h.chainTail(lay, j, j < n-1 || targets) }
	// Step 1: Step's passes.
	passes := h.passes(feeds)
	for k := range passes {
		if err := ctx.Err(); err != nil {
			return lay, submitted, err
		}
		ps := &passes[k]
		ps.mapped = lay.mapped
		if ps.last {
			direct(ps, 0)
		}
		if err := h.writePass(feeds, ps); err != nil {
			return lay, submitted, err
		}
		steps := h.passSteps(ps, B, topN)
		if ps.last {
			steps = append(steps, tail(0)...)
		}
		submitted = true
		if err := h.target.submit(steps, submitEvery); err != nil {
			return lay, true, fmt.Errorf("head pass %d of %d: %w", k+1, len(passes), err)
		}
	}
	// Steps 2 … n: a row an entry, the places of step j's in chainRows[j−1],
	// the pairs the same for every step (written after step 1's are
	// submitted: the queue orders them).
	if err := ctx.Err(); err != nil {
		return lay, true, err
	}
	pairs := make([]uint32, a.regions.words)
	put := func(region uint64, i int, dst, src int) {
		w := region/4 + uint64(i*kernels.GatherPairWords)
		pairs[w], pairs[w+1] = uint32(dst), uint32(src)
	}
	parts := make([]headPart, B)
	for i, f := range feeds {
		slot := f.seq.kv.Slot()
		parts[i] = headPart{feed: i, slot: slot, T: 1, row0: i}
		put(a.regions.x, i, i, a.R+slot)
		put(a.regions.save, i, a.R+slot, i)
		put(a.regions.read, i, i, a.R+slot)
	}
	if err := a.pairs.WriteU32(0, pairs); err != nil {
		return lay, true, err
	}
	var steps []step
	for j := 1; j < n; j++ {
		rows := make([]uint32, B*kernels.RowWords)
		ps := headPass{parts: parts, rows: B, decode: B, nx: B, nsave: B, last: true, rowBuf: a.chainRows[j-1],
			mapped: lay.mapped, fromNext: lay.mapped, xHeld: j > 1, noSave: j < n-1, readX: true}
		direct(&ps, j)
		for i, f := range feeds {
			r := f.L + len(f.tokens) - 1 + j - 1 // the row of the step's token
			kernels.PutRow(rows[i*kernels.RowWords:], f.seq.kv.Slot(), r, treemask.LineRow(r))
			ps.maxLen = max(ps.maxLen, r+1)
		}
		if err := ps.rowBuf.WriteU32(0, rows); err != nil {
			return lay, true, err
		}
		steps = append(steps, h.passSteps(&ps, B, topN)...)
		steps = append(steps, tail(j)...)
	}
	if err := h.target.submit(steps, h.target.chainedEvery()); err != nil {
		return lay, true, fmt.Errorf("chained head steps: %w", err)
	}
	return lay, true, nil
}

// chainDone reads a chain's results (raw, the bytes chainSubmit's results
// held when the device was done) and commits the sequences: it returns
// each entry's n tokens, setting the entries' Next, Logprob and Top to the
// last.
func (h *Head) chainDone(feeds []headFeed, batch []*engine.Entry, lay chainLayout, raw []byte) ([][]engine.Token, error) {
	toks, err := h.chainRead(feeds, batch, lay, raw)
	if err != nil {
		return nil, err
	}
	if err := h.commit(feeds, lay.n-1); err != nil {
		return nil, err
	}
	return toks, nil
}

// chainRead returns each entry's n tokens in the target's vocabulary from
// a chain's results (raw), setting its Next, Logprob and Top to the last.
func (h *Head) chainRead(feeds []headFeed, batch []*engine.Entry, lay chainLayout, raw []byte) ([][]engine.Token, error) {
	if uint64(len(raw)) < lay.bytes() {
		return nil, fmt.Errorf("chain results: %d bytes read back, want %d", len(raw), lay.bytes())
	}
	n := lay.n
	out := make([][]engine.Token, len(feeds))
	for i := range out {
		out[i] = make([]engine.Token, n)
	}
	for j := range n {
		at := uint64(j) * lay.stride
		ids, lps := u32s(raw[at:at+uint64(lay.B)*4]), u32s(raw[at+lay.lpAt:at+lay.lpAt+uint64(lay.B)*4])
		var top []uint32
		if lay.topN > 0 {
			top = u32s(raw[at+lay.topAt : at+lay.topAt+lay.topBytes])
		}
		for i, en := range batch {
			id := int(ids[i])
			switch {
			case ids[i] == kernels.ArgmaxNaN || !lay.mapped && id >= len(h.tokens) || lay.mapped && id >= h.engCfg.VocabSize:
				return nil, fmt.Errorf("chained step %d, batch entry %d: %w", j+1, i, sampling.ErrNaN)
			case !lay.mapped:
				id = int(h.tokens[id])
			}
			tk := engine.Token{ID: id, Logprob: math.Float32frombits(lps[i])}
			if k := min(en.TopN, lay.topN); k > 0 {
				tk.Top = kernels.SampleTop(top[i*lay.topN*2:], k)
				for m := range tk.Top {
					tk.Top[m].Token = int(h.tokens[tk.Top[m].Token])
				}
			}
			out[i][j] = tk
		}
	}
	for i, en := range batch {
		last := out[i][n-1]
		en.Next, en.Logprob, en.Top = last.ID, last.Logprob, last.Top
	}
	return out, nil
}
