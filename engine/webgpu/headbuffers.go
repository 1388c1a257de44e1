package webgpu

import (
	"fmt"

	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
	"webdraft/sampling"
	"webdraft/tensor"
	"webdraft/treemask"
)

// headWeights is an EAGLE-3 head on the GPU, uploaded once.
type headWeights struct {
	// embed is the head's embed_tokens (vocab, H), or its target's, which
	// the head does not release.
	embed *kernels.Matrix
	fc    *kernels.Matrix // (H, 3·Ht)
	// qkv is q_proj, k_proj, v_proj stacked: ((heads + 2·kv_heads)·D, 2H),
	// over [input_layernorm(embedding); hidden_norm(hidden)].
	qkv                                   *kernels.Matrix
	o                                     *kernels.Matrix // (H, heads·D)
	gateUp                                *kernels.Matrix // gate_proj stacked over up_proj: (2I, H)
	down                                  *kernels.Matrix // (H, I)
	lmHead                                *kernels.Matrix // (Vd, H)
	inputNorm, hiddenNorm, postNorm, norm *gpu.Buffer     // (H)
	// rope is RoPE's inverse frequencies for qkv_rope_kv.wgsl, after unit
	// q/k norms it does not read (kernels.UploadQKNormRope; QKVRopeKV
	// without qkNorm).
	rope *gpu.Buffer
	// targetIDs is the target token of each draft token (Vd) u32: a
	// chained step (StepN) maps its argmax through it on the device.
	targetIDs *gpu.Buffer
	mats      []*kernels.Matrix // the head's own, for release
	buffers   []*gpu.Buffer
}

// uploadHead copies w to the device; the head embeds with targetEmbed
// where w has no embedding of its own.
func uploadHead(d *gpu.Device, c *eagle3.Config, layer *qwen3.Config, w *eagle3.Weights, targetEmbed *kernels.Matrix) (_ *headWeights, err error) {
	hw := &headWeights{embed: targetEmbed}
	defer func() {
		if err != nil {
			hw.release()
		}
	}()
	mat := func(dst **kernels.Matrix, m *kernels.Matrix, err error) error {
		if err == nil {
			hw.mats = append(hw.mats, m)
			*dst = m
		}
		return err
	}
	if w.EmbedTokens != nil {
		m, err := kernels.UploadMatrix(d, eagle3.EmbedName, w.EmbedTokens)
		if err := mat(&hw.embed, m, err); err != nil {
			return nil, err
		}
	}
	for _, m := range []struct {
		dst  **kernels.Matrix
		name string
		ms   []tensor.Matrix
	}{
		{&hw.fc, "fc.weight", []tensor.Matrix{w.FC}},
		{&hw.qkv, "midlayer.self_attn.qkv_proj", []tensor.Matrix{w.QProj, w.KProj, w.VProj}},
		{&hw.o, "midlayer.self_attn.o_proj.weight", []tensor.Matrix{w.OProj}},
		{&hw.gateUp, "midlayer.mlp.gate_up_proj", []tensor.Matrix{w.GateProj, w.UpProj}},
		{&hw.down, "midlayer.mlp.down_proj.weight", []tensor.Matrix{w.DownProj}},
		{&hw.lmHead, "lm_head.weight", []tensor.Matrix{w.LMHead}},
	} {
		var up *kernels.Matrix
		var err error
		if len(m.ms) == 1 {
			up, err = kernels.UploadMatrix(d, m.name, m.ms[0])
		} else {
			up, err = kernels.UploadStacked(d, m.name, m.ms...)
		}
		if err := mat(m.dst, up, err); err != nil {
			return nil, err
		}
	}
	for _, v := range []struct {
		dst  **gpu.Buffer
		name string
		data []float32
	}{
		{&hw.inputNorm, "midlayer.input_layernorm.weight", w.InputLayernorm},
		{&hw.hiddenNorm, "midlayer.hidden_norm.weight", w.HiddenNorm},
		{&hw.postNorm, "midlayer.post_attention_layernorm.weight", w.PostAttentionLayernorm},
		{&hw.norm, "norm.weight", w.Norm},
	} {
		b, err := d.UploadF32(v.name, v.data)
		if err != nil {
			return nil, err
		}
		hw.buffers = append(hw.buffers, b)
		*v.dst = b
	}
	ones := make([]float32, layer.HeadDim)
	for i := range ones {
		ones[i] = 1
	}
	if hw.rope, err = kernels.UploadQKNormRope(d, "midlayer.rope", ones, ones, layer.RopeInvFreq(), nil); err != nil {
		return nil, err
	}
	hw.buffers = append(hw.buffers, hw.rope)
	ids := make([]uint32, len(w.TargetIDs))
	for i, id := range w.TargetIDs {
		ids[i] = uint32(id)
	}
	if hw.targetIDs, err = d.UploadU32("d2t", ids); err != nil {
		return nil, err
	}
	hw.buffers = append(hw.buffers, hw.targetIDs)
	return hw, nil
}

func (w *headWeights) release() {
	for _, m := range w.mats {
		m.Release()
	}
	for _, b := range w.buffers {
		b.Release()
	}
	w.mats, w.buffers = nil, nil
}

// headActivations are a head pass's buffers, sized for R rows a pass and S
// sequence slots (R = HeadOptions.MaxRows, S = HeadOptions.MaxSequences).
type headActivations struct {
	R, S   int
	ids    *gpu.Buffer // (R) u32: the rows' tokens
	rowBuf *gpu.Buffer // (R, kernels.RowWords) u32: each row's place in the head's cache
	fcIn   *gpu.Buffer // (R, F) f32: the features of the rows that read the target's, F = features·Ht
	// hid (R + S, H) f32: fc's output, a row each row over the target's
	// features, then the store: row R + s holds the output before norm of
	// the last row computed of the sequence in slot s.
	hid     *gpu.Buffer
	x, emb  *gpu.Buffer // (R, H): the hidden, then the residual stream; the tokens' embeddings
	in      *gpu.Buffer // (R, 2H): [input_layernorm(emb); hidden_norm(x)]
	qkv     *gpu.Buffer // (R, (heads + 2·kv_heads)·D)
	q, attn *gpu.Buffer // (R, heads·D)
	gateUp  *gpu.Buffer // (R, 2I)
	pairs   *gpu.Buffer // the gathers' pairs, a region each (pairsAt)
	regions pairRegions
	hLast   *gpu.Buffer // (S, H): the read-out rows' outputs before norm
	logits  *gpu.Buffer // (S, Vd)
	// next holds argmax.wgsl's (or sample.wgsl's) draft ids (S) u32, and
	// from nextLP (a binding's offset) their log-probabilities and
	// log-sum-exps (lseAt(S) + S) f32 (lp): a chained step's results take
	// both in one copy.
	next    *gpu.Buffer
	nextLP  uint64
	draws   *gpu.Buffer // (S, kernels.SampleDrawWords) u32: greedy rows
	temps   *gpu.Buffer // (S, kernels.SampleTempWords) f32
	sampled *gpu.Buffer // (S, kernels.SampleWords) u32
	top     *gpu.Buffer // (S, MaxTopN, 2) u32
	// nodes (S·treemask.MaxNodes, H) f32 is the node store: row
	// s·MaxNodes + i holds the output before norm of node i of the tree of
	// the sequence in slot s (nil until a Verify feeds tree nodes:
	// ensureNodes).
	nodes *gpu.Buffer
	// A chain (StepN): mapSrc holds the pairs (2i+1, i) that gather each
	// read-out row's argmax into the odd word of pair i of mapPairs, whose
	// even words hold i, so that mapPairs gathers each row's target token
	// from headWeights.targetIDs into ids (S pairs each); chainRows the
	// places of a chained step's rows, a buffer a step, and results each
	// step's read-out words — or a Verify's, each pass's (verifyLayout) —
	// grown as calls need them.
	mapSrc, mapPairs *gpu.Buffer
	chainRows        []*gpu.Buffer
	results          *gpu.Buffer
	// chainKeys holds a fused call's coupled drafts' keys (coupleKeys),
	// grown as calls need them; nil until one couples.
	chainKeys *gpu.Buffer
	// A Verify's proposals (nil until one draws: ensurePropose): the rows'
	// logits scattered over the vocabulary (S, V) f32, propose.wgsl's
	// inputs (S, kernels.ProposeWords) u32 and tokens drawn (S,
	// kernels.ProposeDrawnWords) u32.
	logitsV, props, drawn *gpu.Buffer
	all                   []*gpu.Buffer
}

// pairRegions are where the pairs buffer holds each gather's pairs, byte
// offsets aligned for a binding: the features' (one region of R pairs a
// feature buffer), the hidden's from the hidden store (R) and from the
// node store (nodeX, R), the outputs kept in the store (R) and in the node
// store (nodeSave, R), the read-out's (S).
type pairRegions struct {
	features                       []uint64
	x, nodeX, save, nodeSave, read uint64
	words                          int // the buffer's u32 words
}

func newHeadActivations(d *gpu.Device, c *eagle3.Config, layer *qwen3.Config, R, S, features int) (_ *headActivations, err error) {
	a := &headActivations{R: R, S: S}
	defer func() {
		if err != nil {
			a.release()
		}
	}()
	H, Ht, I, Vd := c.HiddenSize, c.TargetHiddenSize, c.IntermediateSize, c.DraftVocabSize
	qDim, kvDim := layer.QDim(), layer.KVDim()
	align := uint64(d.Limits().MinStorageBufferOffsetAlignment)
	region := func(at *uint64, pairs int) uint64 {
		off := *at
		*at += (uint64(pairs*kernels.GatherPairWords)*4 + align - 1) / align * align
		return off
	}
	var at uint64
	for range features {
		a.regions.features = append(a.regions.features, region(&at, R))
	}
	a.regions.x, a.regions.nodeX, a.regions.save = region(&at, R), region(&at, R), region(&at, R)
	a.regions.nodeSave, a.regions.read = region(&at, R), region(&at, S)
	a.regions.words = int(at / 4)
	a.nextLP = (uint64(lseAt(S))*4 + align - 1) / align * align
	limit := d.Limits().MaxStorageBufferBindingSize
	for _, b := range []struct {
		dst   **gpu.Buffer
		name  string
		words int
	}{
		{&a.ids, "head.ids", (R + 3) &^ 3}, {&a.rowBuf, "head.rows", R * kernels.RowWords},
		{&a.fcIn, "head.features", R * features * Ht}, {&a.hid, "head.hidden_store", (R + S) * H},
		{&a.x, "head.hidden", R * H}, {&a.emb, "head.embeds", R * H}, {&a.in, "head.normed", R * 2 * H},
		{&a.qkv, "head.qkv", R * (qDim + 2*kvDim)}, {&a.q, "head.q", R * qDim}, {&a.attn, "head.attn", R * qDim},
		{&a.gateUp, "head.gate_up", R * 2 * I}, {&a.pairs, "head.pairs", a.regions.words},
		{&a.hLast, "head.hidden_last", S * H}, {&a.logits, "head.logits", S * Vd},
		{&a.next, "head.next", int(a.nextLP/4) + lseAt(S) + S},
		{&a.draws, "head.draws", S * kernels.SampleDrawWords}, {&a.temps, "head.temps", S * kernels.SampleTempWords},
		{&a.sampled, "head.sampled", S * kernels.SampleWords}, {&a.top, "head.top", (S*engine.MaxTopN*2 + 3) &^ 3},
		{&a.mapSrc, "head.map_src", S * kernels.GatherPairWords}, {&a.mapPairs, "head.map_pairs", S * kernels.GatherPairWords},
	} {
		if uint64(b.words)*4 > limit {
			return nil, fmt.Errorf("activations: %s takes %d bytes, more than one binding (%d): fewer rows a pass (MaxRows) or sequences", b.name, b.words*4, limit)
		}
		if *b.dst, err = d.NewBuffer(b.name, uint64(b.words)*4); err != nil {
			return nil, fmt.Errorf("activations: %w", err)
		}
		a.all = append(a.all, *b.dst)
	}
	src, pairs := make([]uint32, S*kernels.GatherPairWords), make([]uint32, S*kernels.GatherPairWords)
	for i := range S {
		src[2*i], src[2*i+1], pairs[2*i] = uint32(2*i+1), uint32(i), uint32(i)
	}
	if err := a.mapSrc.WriteU32(0, src); err != nil {
		return nil, fmt.Errorf("activations: %w", err)
	}
	if err := a.mapPairs.WriteU32(0, pairs); err != nil {
		return nil, fmt.Errorf("activations: %w", err)
	}
	if err := a.writeGreedy(); err != nil {
		return nil, fmt.Errorf("activations: %w", err)
	}
	return a, nil
}

// writeGreedy writes sample.wgsl's inputs for greedy read-out rows, what
// every read-out takes but a Verify's that draws proposals
// (headpropose.go), which writes them back after its passes.
func (a *headActivations) writeGreedy() error {
	draws, temps := make([]uint32, a.S*kernels.SampleDrawWords), make([]float32, a.S*kernels.SampleTempWords)
	for i := range a.S {
		kernels.PutSampleRow(draws[i*kernels.SampleDrawWords:], temps[i*kernels.SampleTempWords:], sampling.Params{}, sampling.Draw{X: sampling.NoProposal})
	}
	if err := a.draws.WriteU32(0, draws); err != nil {
		return err
	}
	return a.temps.WriteF32(0, temps)
}

// ensureNodes allocates the node store for outputs of H values,
// the first time a pass feeds tree nodes.
func (a *headActivations) ensureNodes(d *gpu.Device, H int) error {
	if a.nodes != nil {
		return nil
	}
	bytes := uint64(a.S*treemask.MaxNodes*H) * 4
	if limit := d.Limits().MaxStorageBufferBindingSize; bytes > limit {
		return fmt.Errorf("the node store of %d sequences' token trees takes %d bytes, more than one binding (%d): fewer sequences (MaxSequences)", a.S, bytes, limit)
	}
	b, err := d.NewBuffer("head.node_store", bytes)
	if err != nil {
		return fmt.Errorf("the node store: %w", err)
	}
	a.nodes = b
	return nil
}

// ensureChain readies a chain of m steps after the first: m buffers of
// the rows' places, and results of at least bytes (a Verify's: m = 0).
func (a *headActivations) ensureChain(d *gpu.Device, m int, bytes uint64) error {
	for len(a.chainRows) < m {
		b, err := d.NewBuffer(fmt.Sprintf("head.chain_rows.%d", len(a.chainRows)), uint64(a.S*kernels.RowWords)*4)
		if err != nil {
			return err
		}
		a.chainRows = append(a.chainRows, b)
	}
	if a.results != nil && a.results.Size() >= bytes {
		return nil
	}
	if a.results != nil {
		bytes = max(bytes, 2*a.results.Size())
	}
	b, err := d.NewBuffer("head.chain_results", bytes)
	if err != nil {
		return err
	}
	if a.results != nil {
		a.results.Release()
	}
	a.results = b
	return nil
}

// lp is the read-out's log-probabilities and log-sum-exps: next from
// nextLP on.
func (a *headActivations) lp() gpu.Binding { return a.next.Slice(a.nextLP, a.next.Size()-a.nextLP) }

func (a *headActivations) release() {
	for _, b := range a.all {
		b.Release()
	}
	for _, b := range a.chainRows {
		b.Release()
	}
	for _, b := range []*gpu.Buffer{a.results, a.nodes, a.chainKeys} {
		if b != nil {
			b.Release()
		}
	}
	a.all, a.chainRows, a.results, a.nodes, a.chainKeys = nil, nil, nil, nil, nil
}
