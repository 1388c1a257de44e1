package kernels

import (
	"errors"
	"fmt"
	"math"

	"webdraft/gpu"
	"webdraft/shaders"
)

var decodeTailKernel = gpu.Kernel{
	Module: "decode_tail.wgsl", Source: shaders.DecodeTail, Entry: "main", ParamsSize: 48,
	// sync, x, attn, gu, qkv, then codes and scales of o, gate|up, down, the
	// next q|k|v, then post_norm, in_norm
	Storage: []gpu.Access{gpu.ReadWrite, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite,
		gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly,
		gpu.ReadOnly, gpu.ReadOnly},
}

// decode_tail.wgsl's layout: workgroup size, threads a row group, and the
// code vec4s a thread holds (see its header).
const (
	decodeTailWG    = 128
	decodeTailLanes = 32
	decodeTailWR    = 12
	decodeTailKC    = 2048 // input values staged at a time, at most
)

// tailPlan is decode_tail.wgsl's specialization for one model shape and
// workgroup count: wpt code vec4s a lane a row for each input width, rt
// rows a thread for each phase.
type tailPlan struct {
	kc, wptQD, wptH, wptI, rtO, rtGU, rtD, rtQKV int
}

// planTail lays out the phases of a model with hidden size h, o_proj
// inputs qd, intermediate size im and nqkv q|k|v rows over groups
// workgroups: each phase's rows a thread as few as give at most one tile a
// workgroup (a single round of loads), within decodeTailWR vec4s a thread.
// It fails where one row's vec4s a lane alone exceed that.
func planTail(h, qd, im, nqkv, groups int) (tailPlan, bool) {
	wpt := func(k int) int { return int(divCeil(k/32, decodeTailLanes)) }
	p := tailPlan{kc: min(decodeTailKC, max(h, qd, im)), wptQD: wpt(qd), wptH: wpt(h), wptI: wpt(im)}
	if max(p.wptQD, p.wptH, p.wptI) > decodeTailWR {
		return p, false
	}
	rt := func(n, wpt int) int {
		return min(max(int(divCeil(n, decodeTailWG/decodeTailLanes*groups)), 1), decodeTailWR/wpt)
	}
	p.rtO, p.rtGU, p.rtD, p.rtQKV = rt(h, p.wptQD), rt(2*im, p.wptH), rt(h, p.wptI), rt(nqkv, p.wptH)
	return p, true
}

// rtMax sizes the partial sums' workgroup memory: the most rows a thread
// of any phase, and at least 2 (the input's sums of squares share it).
func (p tailPlan) rtMax() int { return max(p.rtO, p.rtGU, p.rtD, p.rtQKV, 2) }

func (p tailPlan) consts() gpu.Consts {
	return gpu.Consts{"KC": uint32(p.kc), "WPT_QD": uint32(p.wptQD), "WPT_H": uint32(p.wptH), "WPT_I": uint32(p.wptI),
		"RT_O": uint32(p.rtO), "RT_GU": uint32(p.rtGU), "RT_D": uint32(p.rtD), "RT_QKV": uint32(p.rtQKV), "RTMAX": uint32(p.rtMax())}
}

// memory is the workgroup memory the plan takes: the staged input, a
// tile's partial sums (or the sums of squares), the barrier's generation.
func (p tailPlan) memory() uint32 {
	return uint32(4*p.kc + 4*decodeTailWG*p.rtMax() + 4)
}

// Polls a grid barrier waits at most: in a step, and while probing how
// many workgroups run at once. On the H200 a poll is an L2 round trip, so
// a step gives up after about a second; a barrier that is merely slow
// waits microseconds.
const (
	decodeTailSpins      = 1 << 21
	decodeTailProbeSpins = 1 << 14
)

// ErrNoDecodeTail is returned by NewDecodeTail where the device cannot run
// the persistent kernel — its storageBarrier is not device-wide, or its
// limits do not hold the kernel's bindings and workgroup memory — or the
// model's shapes do not fit it.
var ErrNoDecodeTail = errors.New("no persistent decode tail")

// DecodeTail runs decode_tail.wgsl: one row's decoder layer from the
// attention's output on — x += o_proj(attn), the MLP with its norm, and
// the next layer's normalized q|k|v projection — as one dispatch of
// workgroups that all run at once and meet at grid barriers between the
// four matrix-vector products, where the dispatch path takes four
// dispatches. The model's shapes are fixed when it is made.
type DecodeTail struct {
	d               *gpu.Device
	pipe            *gpu.Pipeline
	sync            *gpu.Buffer // the barrier's words
	unread          *gpu.Buffer // bound in place of absent read-only buffers
	groups          int
	h, qd, im, nqkv int
	phases          uint32 // bit k: run phase k (BenchmarkDecodeTail leaves some out)
}

// NewDecodeTail compiles the tail for hidden size h, o_proj inputs qd
// (heads · head_dim), intermediate size im and nqkv q|k|v rows, and finds
// how many of its workgroups the device runs at once: groups workgroups if
// groups > 0 (the caller vouches for them), else on a GPU the most of 1,
// 2, 4, … 1,024 that a probe dispatch sees all arrive, and on a CPU
// adapter one. It returns ErrNoDecodeTail (wrapped) where the device or
// the shapes cannot take it.
func NewDecodeTail(d *gpu.Device, h, qd, im, nqkv, groups int) (*DecodeTail, error) {
	if h <= 0 || qd <= 0 || im <= 0 || nqkv <= 0 || h%32 != 0 || qd%32 != 0 || im%32 != 0 {
		return nil, fmt.Errorf("kernels: decode tail: sizes %d, %d, %d, %d: need positive multiples of 32", h, qd, im, nqkv)
	}
	if !d.DeviceScopeBarrier() {
		return nil, fmt.Errorf("kernels: decode tail: %w: storageBarrier is not device-wide on %s", ErrNoDecodeTail, d.Info())
	}
	if l := d.Limits(); l.MaxStorageBuffersPerShaderStage < uint32(len(decodeTailKernel.Storage)) {
		return nil, fmt.Errorf("kernels: decode tail: %w: %d storage buffers a stage, need %d", ErrNoDecodeTail, l.MaxStorageBuffersPerShaderStage, len(decodeTailKernel.Storage))
	}
	sync, err := d.NewBuffer("decode_tail.sync", 16)
	if err != nil {
		return nil, fmt.Errorf("kernels: decode tail: %w", err)
	}
	t := &DecodeTail{d: d, sync: sync, groups: groups, h: h, qd: qd, im: im, nqkv: nqkv, phases: 0xF}
	if t.unread, err = d.NewBuffer("decode_tail.unread", 16); err != nil {
		sync.Release()
		return nil, fmt.Errorf("kernels: decode tail: %w", err)
	}
	if err := t.setUp(); err != nil {
		t.Release()
		return nil, err
	}
	return t, nil
}

// setUp compiles the pipeline planned for t.groups workgroups (512 while
// they are not known) and probes how many run at once; when that count
// plans differently, it compiles and probes once more.
func (t *DecodeTail) setUp() error {
	given := t.groups > 0
	if !given && t.d.Info().Type == "cpu" {
		// lavapipe ran the grid barrier out of order with two workgroups
		// (after its own probe passed): one workgroup, whose barrier is
		// trivial.
		t.groups, given = 1, true
	}
	guess := t.groups
	if !given {
		guess = 512
	}
	for range 2 {
		plan, ok := planTail(t.h, t.qd, t.im, t.nqkv, guess)
		if !ok {
			return fmt.Errorf("kernels: decode tail: %w: rows of %d inputs need more than %d vec4s a thread", ErrNoDecodeTail, max(t.h, t.qd, t.im), decodeTailWR)
		}
		if need := plan.memory(); t.d.Limits().MaxComputeWorkgroupStorageSize < need {
			return fmt.Errorf("kernels: decode tail: %w: %d bytes of workgroup memory, need %d", ErrNoDecodeTail, t.d.Limits().MaxComputeWorkgroupStorageSize, need)
		}
		pipe, err := t.d.Pipeline(decodeTailKernel, plan.consts())
		if err != nil {
			return fmt.Errorf("kernels: decode tail: %w", err)
		}
		t.pipe = pipe
		if given {
			return nil
		}
		if t.groups, err = t.probe(); err != nil {
			return err
		}
		if next, _ := planTail(t.h, t.qd, t.im, t.nqkv, t.groups); next == plan {
			return nil
		}
		guess = t.groups
	}
	return nil
}

// probe returns the most workgroups, up to decodeTailMaxGroups, that pass
// one grid barrier together within decodeTailProbeSpins polls: powers of
// two first, then a bisection between the last that passed and the first
// that did not (on the H200 the count is a multiple of its 132 SMs).
func (t *DecodeTail) probe() (int, error) {
	pass, fail := 0, decodeTailMaxGroups+1
	for g := 1; g <= decodeTailMaxGroups; g *= 2 {
		ok, err := t.together(g)
		if err != nil {
			return 0, err
		}
		if !ok {
			fail = g
			break
		}
		pass = g
	}
	if pass == 0 {
		return 0, fmt.Errorf("kernels: decode tail: %w: not even one workgroup passed the probe", ErrNoDecodeTail)
	}
	for fail-pass > 1 {
		mid := (pass + fail) / 2
		ok, err := t.together(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			pass = mid
		} else {
			fail = mid
		}
	}
	return pass, nil
}

// decodeTailMaxGroups bounds the probe.
const decodeTailMaxGroups = 2048

// together reports whether g workgroups of the pipeline pass a grid
// barrier together, and leaves the barrier's words at zero.
func (t *DecodeTail) together(g int) (bool, error) {
	b, err := t.d.NewBatch("decode_tail.probe")
	if err != nil {
		return false, fmt.Errorf("kernels: decode tail probe: %w", err)
	}
	params := []uint32{0, 0, 0, 0, 32, uint32(g), 0, decodeTailProbeSpins, 0, 0, 0, 0}
	if err := b.Dispatch(t.pipe, params, t.bindings(nil, nil, nil, nil, nil, nil, nil, nil, nil, nil), uint32(g), 1, 1); err != nil {
		b.Discard()
		return false, fmt.Errorf("kernels: decode tail probe: %w", err)
	}
	if err := b.Submit(); err != nil {
		return false, fmt.Errorf("kernels: decode tail probe: %w", err)
	}
	timeouts, err := t.Timeouts()
	if err != nil {
		return false, err
	}
	return timeouts == 0, t.Reset()
}

// Groups is how many workgroups a dispatch runs.
func (t *DecodeTail) Groups() int { return t.groups }

// Timeouts reads how many times a workgroup gave up waiting at a grid
// barrier since the last Reset (each such step's logits are NaN).
func (t *DecodeTail) Timeouts() (int, error) {
	w, err := t.sync.ReadU32()
	if err != nil {
		return 0, fmt.Errorf("kernels: decode tail: %w", err)
	}
	return int(w[2]), nil
}

// Reset zeroes the barrier's words, as they must be after a timeout.
func (t *DecodeTail) Reset() error {
	if err := t.sync.Fill(0); err != nil {
		return fmt.Errorf("kernels: decode tail: %w", err)
	}
	return nil
}

// Release frees the tail's buffers.
func (t *DecodeTail) Release() {
	t.sync.Release()
	t.unread.Release()
}

// bindings lists the kernel's buffers. Absent ones (the probe's, and the
// next layer's on the last) are never touched: read-write ones are bound
// to the sync buffer, read-only ones to unread (one buffer may not be
// bound both ways in a dispatch).
func (t *DecodeTail) bindings(x, attn, gateUp, qkv *gpu.Buffer, o, gu, down, next *Matrix, postNorm, inNorm *gpu.Buffer) []gpu.Binding {
	bind := func(b, absent *gpu.Buffer) gpu.Binding {
		if b == nil {
			return absent.All()
		}
		return b.All()
	}
	binds := []gpu.Binding{t.sync.All(), bind(x, t.sync), bind(attn, t.unread), bind(gateUp, t.sync), bind(qkv, t.sync)}
	for _, m := range []*Matrix{o, gu, down, next} {
		if m == nil {
			binds = append(binds, t.unread.All(), t.unread.All())
		} else {
			binds = append(binds, m.W.All(), m.Scales.All())
		}
	}
	return append(binds, bind(postNorm, t.unread), bind(inNorm, t.unread))
}

// Fits reports why the tail cannot take a layer's matrices, or nil: o,
// gateUp, down and next (nil on the last layer) must be int4 of one group
// size, a multiple of 32, in the shapes the tail was made for.
func (t *DecodeTail) Fits(o, gateUp, down, next *Matrix) error {
	if o == nil {
		return errors.New("kernels: decode tail: nil o_proj")
	}
	shapes := []struct {
		m    *Matrix
		n, k int
	}{{o, t.h, t.qd}, {gateUp, 2 * t.im, t.h}, {down, t.h, t.im}}
	if next != nil {
		shapes = append(shapes, struct {
			m    *Matrix
			n, k int
		}{next, t.nqkv, t.h})
	}
	for _, s := range shapes {
		switch {
		case s.m == nil:
			return errors.New("kernels: decode tail: nil matrix")
		case s.m.Format != Int4 || s.m.N != s.n || s.m.K != s.k:
			return fmt.Errorf("kernels: decode tail: %s is %v (%d, %d), want int4 (%d, %d)", s.m.Name, s.m.Format, s.m.N, s.m.K, s.n, s.k)
		case s.m.G != o.G || s.m.G%32 != 0 || s.m.K%s.m.G != 0:
			return fmt.Errorf("kernels: decode tail: %s has group size %d, want %d, a multiple of 32 dividing %d", s.m.Name, s.m.G, o.G, s.m.K)
		}
	}
	return nil
}

// Record records one row's layer tail:
//
//	x      (H) f32 hidden state, updated: x += o(attn); x += down(silu(g)·u)
//	attn   (QD) f32 attention output
//	gateUp (2I) f32 scratch: g | u = gateUp(rmsnorm(x) · postNorm)
//	qkv    (NQKV) f32, written: next(rmsnorm(x) · nextNorm), when next
//	       is not nil (nil: the last layer)
//
// The matrices must fit (Fits); eps is both RMSNorms'.
func (t *DecodeTail) Record(b *gpu.Batch, x, attn, gateUp, qkv *gpu.Buffer, o, gu, down, next *Matrix, postNorm, nextNorm *gpu.Buffer, eps float64) error {
	const op = "decode_tail"
	if err := t.Fits(o, gu, down, next); err != nil {
		return err
	}
	H, QD, I := t.h, t.qd, t.im
	checks := []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"x", x, H}, {"attn", attn, QD}, {"gate_up", gateUp, 2 * I}, {"post_norm", postNorm, H}, {"qkv", qkv, 0}, {"next_norm", nextNorm, 0}}
	nqkv := 0
	if next != nil {
		nqkv = next.N
		checks[4].n, checks[5].n = nqkv, H
	} else {
		qkv, nextNorm = nil, postNorm
		checks = checks[:4]
	}
	for _, c := range checks {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	params := []uint32{uint32(H), uint32(QD), uint32(I), uint32(nqkv), uint32(o.G), uint32(t.groups),
		math.Float32bits(float32(eps)), decodeTailSpins, t.phases, 0, 0, 0}
	if err := b.Dispatch(t.pipe, params, t.bindings(x, attn, gateUp, qkv, o, gu, down, next, postNorm, nextNorm), uint32(t.groups), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
