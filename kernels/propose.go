package kernels

import (
	"fmt"
	"math"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var (
	proposeWeights = gpu.Kernel{
		Module: "propose.wgsl", Source: shaders.Propose, Entry: "weights", Params: reflect.TypeFor[proposeParams](),
		Storage: proposeStorage,
	}
	proposeDraw = gpu.Kernel{
		Module: "propose.wgsl", Source: shaders.Propose, Entry: "draw", Params: reflect.TypeFor[proposeParams](),
		Storage: proposeStorage,
	}
	proposeDense = gpu.Kernel{
		Module: "propose.wgsl", Source: shaders.Propose, Entry: "dense", Params: reflect.TypeFor[proposeParams](),
		Storage: proposeStorage,
	}
	// logits, sampled, temps, props, drawn, qstore, wsum
	proposeStorage = []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite}
)

// proposeParams are propose.wgsl's params.
type proposeParams struct{ V, Chunks, Slots, Rows uint32 }

// propose.wgsl's sizes: the logits a workgroup of its row-wide passes
// covers (CHUNK, sample.wgsl's) and the most chunks a row may have (MAXG).
const (
	proposeChunk     = 2048
	proposeMaxChunks = 512
)

// ProposeMax is the most tokens a row draws (engine.MaxTopN).
const ProposeMax = 20

// ProposeWords is how many u32 words a row takes in Propose's props
// (PutProposeRow), and ProposeDrawnWords in its drawn (ProposeDrawn).
const (
	ProposeWords      = 4 + ProposeMax
	ProposeDrawnWords = 2 * ProposeMax
)

// ProposeNoSlot is a row's Q-store slot when its q is not kept.
const ProposeNoSlot = -1

// Propose records a sampled drafter's proposals for rows of logits that
// Sample has just read out (propose.wgsl): each row draws its tokens from
// its distribution q (sampling.Dist of the row under its temperature and
// top_p) without replacement — sampling.DrawDistinct, in vocabulary token
// order — and writes q densely over the vocabulary into the Q store at the
// row's slot, for TreeWalk. Three dispatches: one workgroup a 2,048-logit
// chunk of a row sums its weights, one a row draws, one a chunk writes q
// (the chunk weights live in the device's scratch buffer between them).
//
//	logits  (rows, V) f32: vocabulary-wide rows (a partial head's
//	        scattered among −∞), as Sample read them
//	sampled (rows, SampleWords) u32, temps (rows, SampleTempWords) f32:
//	        Sample's out and temps for the same rows
//	props   (rows, ProposeWords) u32: PutProposeRow
//	drawn   (rows, ProposeDrawnWords) u32: ProposeDrawn
//	qstore  (slots, V) f32: row r's q at its slot; other slots untouched
func Propose(b *gpu.Batch, drawn, qstore, logits, sampled, temps, props *gpu.Buffer, rows, V, slots int) error {
	op := "propose"
	chunks := (V + proposeChunk - 1) / proposeChunk
	if rows <= 0 || V <= 0 || slots <= 0 || chunks > proposeMaxChunks {
		return fmt.Errorf("kernels: %s: shape (%d, %d), %d slots (at most %d logits a row)", op, rows, V, slots, proposeChunk*proposeMaxChunks)
	}
	for _, c := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"logits", logits, rows * V}, {"sampled", sampled, rows * SampleWords}, {"temps", temps, rows * SampleTempWords},
		{"props", props, rows * ProposeWords}, {"drawn", drawn, rows * ProposeDrawnWords}, {"qstore", qstore, slots * V}} {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	wsumBytes := uint64(rows*chunks+rows) * 4
	wsum, err := b.Device().Scratch(wsumBytes)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{
		logits.Slice(0, uint64(rows*V)*4), sampled.Slice(0, uint64(rows*SampleWords)*4), temps.Slice(0, uint64(rows*SampleTempWords)*4),
		props.Slice(0, uint64(rows*ProposeWords)*4), drawn.Slice(0, uint64(rows*ProposeDrawnWords)*4),
		qstore.Slice(0, uint64(slots*V)*4), wsum.Slice(0, wsumBytes),
	}
	params := &proposeParams{V: uint32(V), Chunks: uint32(chunks), Slots: uint32(slots), Rows: uint32(rows)}
	return dispatchPasses(b, op, params, binds, pass{proposeWeights, chunks, rows}, pass{proposeDraw, rows, 1}, pass{proposeDense, chunks, rows})
}

// PutProposeRow writes one row's props: its uniforms in [0, 1), one a
// token to draw (at most ProposeMax; none draws nothing), and the Q-store
// slot its q goes to (ProposeNoSlot: none).
func PutProposeRow(words []uint32, us []float32, slot int) error {
	if len(us) > ProposeMax {
		return fmt.Errorf("kernels: propose: %d tokens to draw, at most %d", len(us), ProposeMax)
	}
	clear(words[:ProposeWords])
	words[0] = uint32(len(us))
	words[1] = math.MaxUint32
	if slot >= 0 {
		words[1] = uint32(slot)
	}
	for k, u := range us {
		words[4+k] = math.Float32bits(u)
	}
	return nil
}

// ProposeDrawn decodes one row of Propose's drawn: the tokens drawn, in
// draw order, and their log q.
func ProposeDrawn(w []uint32) (tokens []int, logq []float32) {
	for k := range ProposeMax {
		if w[2*k] == math.MaxUint32 {
			break
		}
		tokens = append(tokens, int(w[2*k]))
		logq = append(logq, math.Float32frombits(w[2*k+1]))
	}
	return tokens, logq
}
