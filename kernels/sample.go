package kernels

import (
	"fmt"
	"math"
	"reflect"

	"webdraft/gpu"
	"webdraft/sampling"
	"webdraft/shaders"
)

var (
	samplePartial = gpu.Kernel{
		Module: "sample.wgsl", Source: shaders.Sample, Entry: "partial", Params: reflect.TypeFor[sampleParams](),
		Storage: sampleStorage,
	}
	sampleMerge = gpu.Kernel{
		Module: "sample.wgsl", Source: shaders.Sample, Entry: "merge", Params: reflect.TypeFor[sampleParams](),
		Storage: sampleStorage,
	}
	// logits, draws, temps, parts, out, top, ids, lps
	sampleStorage = []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite}
)

// sampleParams are sample.wgsl's params.
type sampleParams struct{ V, TopN, Chunks, _ uint32 }

// sample.wgsl's first pass: the logits a workgroup covers (CHUNK) and the
// words of the record it writes (REC).
const (
	sampleChunk  = 2048
	sampleRecord = 10 + 2*32
)

// SampleWords is how many u32 words Sample writes a row.
const SampleWords = 8

// SampleDrawWords and SampleTempWords are the words a row takes in
// Sample's draws and temps.
const (
	SampleDrawWords = 4
	SampleTempWords = 2
)

// sampleNone is sample.wgsl's NONE: no proposal, or a NaN row's argmax.
const sampleNone = math.MaxUint32

// sample.wgsl's flags.
const (
	sampleGreedy  = 1 // draws
	sampleOutcome = 2 // draws
	sampleCoupled = 4 // draws: a coupled row (sampling.Draw.Coupled)
	sampleAccept  = 1 // out
	sampleNaN     = 2 // out
	sampleWide    = 4 // out: the nucleus took passes over the whole row
)

// Sample records the verifier's read-out of rows of logits (sample.wgsl):
// each row's argmax and log-probabilities, its topN most likely tokens,
// and for a sampled row the acceptance of its proposal and a draw —
// sampling.Choose and sampling.Top on the GPU, in two dispatches: one
// workgroup a 2,048-logit chunk of a row, then one a row merging them
// (their records live in the device's scratch buffer).
//
//	logits (rows, V) f32
//	draws  (rows, SampleDrawWords) u32, temps (rows, SampleTempWords) f32: PutSampleRow
//	out    (rows, SampleWords) u32: SampleRow
//	top    (rows, max(topN, 1), 2) u32: SampleTop
//	ids    (rows) u32, lp (rows) f32: each row's argmax (ArgmaxNaN for a
//	       row with a NaN) and its log-probability, as Argmax writes them
//	       (lp a range of its own buffer, or of ids' past its first rows
//	       words); a sampled row's outcome instead where SetSampleOutcome
//	       marked it
func Sample(b *gpu.Batch, out, top, ids *gpu.Buffer, lp gpu.Binding, logits, draws, temps *gpu.Buffer, rows, V, topN int) error {
	op := "sample"
	if rows <= 0 || V <= 0 || topN < 0 || topN > V {
		return fmt.Errorf("kernels: %s: shape (%d, %d), top %d", op, rows, V, topN)
	}
	for _, c := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"logits", logits, rows * V}, {"draws", draws, rows * SampleDrawWords}, {"temps", temps, rows * SampleTempWords},
		{"out", out, rows * SampleWords}, {"top", top, rows * max(topN, 1) * 2}, {"ids", ids, rows}} {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	if err := needRange(op, "lp", lp, rows, ids, rows); err != nil {
		return err
	}
	d := b.Device()
	chunks := (V + sampleChunk - 1) / sampleChunk
	partsBytes := uint64(rows*chunks*sampleRecord) * 4
	parts, err := d.Scratch(partsBytes)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{
		logits.Slice(0, uint64(rows*V)*4), draws.Slice(0, uint64(rows*SampleDrawWords)*4), temps.Slice(0, uint64(rows*SampleTempWords)*4),
		parts.Slice(0, partsBytes),
		out.Slice(0, uint64(rows*SampleWords)*4), top.Slice(0, uint64(rows*max(topN, 1)*2)*4),
		ids.Slice(0, uint64(rows)*4), lp.Buf.Slice(lp.Offset, uint64(rows)*4),
	}
	params := &sampleParams{V: uint32(V), TopN: uint32(topN), Chunks: uint32(chunks)}
	return dispatchPasses(b, op, params, binds, pass{samplePartial, chunks, rows}, pass{sampleMerge, rows, 1})
}

// PutSampleRow writes one row's inputs to Sample: its draws words (d's X,
// U and V, and whether it is coupled) and temps words (p's temperature and
// top_p); a greedy p draws nothing.
func PutSampleRow(draws []uint32, temps []float32, p sampling.Params, d sampling.Draw) {
	x := uint32(sampleNone)
	if d.X != sampling.NoProposal {
		x = uint32(d.X)
	}
	var flags uint32
	if p.Greedy() {
		flags = sampleGreedy
	}
	if d.Coupled {
		flags |= sampleCoupled
	}
	draws[0], draws[1], draws[2], draws[3] = x, math.Float32bits(d.U), math.Float32bits(d.V), flags
	topP := p.TopP
	if topP <= 0 {
		topP = 1
	}
	temps[0], temps[1] = p.Temperature, topP
}

// PutSampleSeed puts the seed words of a coupled row's generation where a
// row written by PutSampleRow keeps its key, for SpecKeys to key it by its
// position on the device.
func PutSampleSeed(draws []uint32, k sampling.Keys) { draws[1], draws[2] = k.S0, k.S1 }

// SetSampleOutcome marks a row written by PutSampleRow (its draws words)
// so that, where it samples, Sample writes its outcome to ids and lp in
// place of its argmax: the proposal X where accepted, else the draw, and
// its log-probability — what a chain of passes feeds on and a chained
// speculative step accepts by.
func SetSampleOutcome(draws []uint32) { draws[3] |= sampleOutcome }

// SampleRow decodes one row of Sample's out; sampling.ErrNaN for a row
// that holds a NaN.
func SampleRow(w []uint32) (sampling.Row, error) {
	if w[2]&sampleNaN != 0 {
		return sampling.Row{}, sampling.ErrNaN
	}
	f := func(i int) float32 { return math.Float32frombits(w[i]) }
	return sampling.Row{
		Argmax:        int(w[0]),
		Sample:        int(w[1]),
		Accept:        w[2]&sampleAccept != 0,
		Threshold:     f(3),
		LogSumExp:     f(4),
		ArgmaxLogprob: f(5),
		XLogprob:      f(6),
		SampleLogprob: f(7),
	}, nil
}

// SampleTop decodes one row of Sample's top: its n most likely tokens.
func SampleTop(w []uint32, n int) []sampling.TokenLogprob {
	out := make([]sampling.TokenLogprob, n)
	for i := range out {
		out[i] = sampling.TokenLogprob{Token: int(w[2*i]), Logprob: math.Float32frombits(w[2*i+1])}
	}
	return out
}
