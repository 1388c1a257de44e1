package kernels

import (
	"errors"
	"fmt"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/reference"
	"webdraft/tensor"
)

// tailLayer is one layer's random tail weights, on the host and the GPU.
type tailLayer struct {
	o, gu, down, next    tensor.Matrix
	gO, gGU, gDown, gNxt *Matrix
	postNorm, inNorm     []float32
	gPost, gIn           *gpu.Buffer
}

// want computes the tail on the reference: x is updated, and gu and qkv
// (nil without a next layer) returned.
func (l *tailLayer) want(x, attn []float32, I int, eps float64) (gu, qkv []float32) {
	H := len(x)
	add := func(w tensor.Matrix, in []float32) {
		n, _ := w.Shape()
		y := make([]float32, n)
		reference.MatMul(y, in, w, 1)
		reference.Add(x, y)
	}
	norm := func(w []float32) []float32 {
		h := make([]float32, H)
		reference.RMSNorm(h, x, w, eps)
		return h
	}
	add(l.o, attn)
	gu = make([]float32, 2*I)
	reference.MatMul(gu, norm(l.postNorm), l.gu, 1)
	act := make([]float32, I)
	for i := range act {
		act[i] = reference.SiLU(gu[i]) * gu[I+i]
	}
	add(l.down, act)
	if l.next != nil {
		n, _ := l.next.Shape()
		qkv = make([]float32, n)
		reference.MatMul(qkv, norm(l.inNorm), l.next, 1)
	}
	return gu, qkv
}

// TestDecodeTail runs two layers' tails in one pass, the second without a
// next layer, against the reference, on every probed workgroup count and
// on one workgroup; the barrier's words must be back at rest after.
func TestDecodeTail(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	const eps = 1e-6
	for _, c := range []struct{ H, QD, I, NQKV, G int }{
		{128, 128, 384, 256, 32},      // tiles of whole rows, K below LANES vec4s
		{96, 64, 160, 160, 32},        // a partial last tile in every phase
		{1024, 2048, 3072, 1536, 128}, // two vec4s a lane (K = 2,048), six for down
	} {
		tail, err := NewDecodeTail(d, c.H, c.QD, c.I, c.NQKV, 0)
		if errors.Is(err, ErrNoDecodeTail) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer tail.Release()
		counts := []int{tail.Groups()}
		if tail.Groups() > 1 {
			counts = append(counts, 1)
		}
		for _, groups := range counts {
			t.Run(fmt.Sprintf("H=%d/QD=%d/I=%d/groups=%d", c.H, c.QD, c.I, groups), func(t *testing.T) {
				tl := *tail
				tl.groups = groups
				layers := make([]tailLayer, 2)
				for i := range layers {
					l := &layers[i]
					l.o = randMatrix(t, r, Int4, c.H, c.QD, c.G)
					l.gu = randMatrix(t, r, Int4, 2*c.I, c.H, c.G)
					l.down = randMatrix(t, r, Int4, c.H, c.I, c.G)
					if i == 0 {
						l.next = randMatrix(t, r, Int4, c.NQKV, c.H, c.G)
					}
					for _, m := range []struct {
						dst **Matrix
						src tensor.Matrix
					}{{&l.gO, l.o}, {&l.gGU, l.gu}, {&l.gDown, l.down}, {&l.gNxt, l.next}} {
						if m.src == nil {
							continue
						}
						if *m.dst, err = UploadMatrix(d, "w", m.src); err != nil {
							t.Fatal(err)
						}
						defer (*m.dst).Release()
					}
					l.postNorm, l.inNorm = randVec(r, c.H, 0.2), randVec(r, c.H, 0.2)
					for i := range l.postNorm {
						l.postNorm[i]++
						l.inNorm[i]++
					}
					l.gPost, l.gIn = upload(t, d, "post_norm", l.postNorm), upload(t, d, "in_norm", l.inNorm)
				}
				x := randVec(r, c.H, 1)
				attns := [][]float32{randVec(r, c.QD, 1), randVec(r, c.QD, 1)}
				gx := upload(t, d, "x", x)
				ga := []*gpu.Buffer{upload(t, d, "attn0", attns[0]), upload(t, d, "attn1", attns[1])}
				gGU := []*gpu.Buffer{poisoned(t, d, "gu0", 2*c.I), poisoned(t, d, "gu1", 2*c.I)}
				qkv := poisoned(t, d, "qkv", c.NQKV)
				run(t, d, "decode tail", func(b *gpu.Batch) error {
					for i, l := range layers {
						if err := tl.Record(b, gx, ga[i], gGU[i], qkv, l.gO, l.gGU, l.gDown, l.gNxt, l.gPost, l.gIn, eps); err != nil {
							return err
						}
					}
					return nil
				})
				gu0, qkv0 := layers[0].want(x, attns[0], c.I, eps)
				x1 := append([]float32(nil), x...)
				gu1, _ := layers[1].want(x, attns[1], c.I, eps)
				_ = x1
				checkClose(t, "gate|up, layer 0", readF32(t, gGU[0], 2*c.I), gu0, tolF32)
				checkClose(t, "next q|k|v, layer 0", readF32(t, qkv, c.NQKV), qkv0, tolF32)
				checkClose(t, "gate|up, layer 1", readF32(t, gGU[1], 2*c.I), gu1, tolF32)
				checkClose(t, "x after both", readF32(t, gx, c.H), x, tolF32)
				s, err := tail.sync.ReadU32()
				if err != nil {
					t.Fatal(err)
				}
				if s[0] != 0 || s[2] != 0 {
					t.Errorf("barrier words after the pass: %d arrivals, %d timeouts (want 0, 0)", s[0], s[2])
				}
			})
		}
	}
}

// TestPlanTail checks decode_tail.wgsl's layouts at Qwen3-1.7B's shapes:
// one tile a workgroup or fewer in every phase at 512 workgroups, within
// the registers and the workgroup memory that lets four workgroups share
// an SM of the H200, and a refusal where one row's vec4s a lane do not fit.
func TestPlanTail(t *testing.T) {
	p, ok := planTail(2048, 2048, 6144, 4096, 512)
	want := tailPlan{kc: 2048, wptQD: 2, wptH: 2, wptI: 6, rtO: 1, rtGU: 6, rtD: 1, rtQKV: 2}
	if !ok || p != want {
		t.Errorf("Qwen3-1.7B at 512 workgroups: %+v, %v; want %+v", p, ok, want)
	}
	if m := p.memory(); m > 12<<10 {
		t.Errorf("Qwen3-1.7B: %d bytes of workgroup memory, more than 12 KiB", m)
	}
	for _, c := range []struct{ n, wpt, rt int }{{2048, p.wptQD, p.rtO}, {12288, p.wptH, p.rtGU}, {2048, p.wptI, p.rtD}, {4096, p.wptH, p.rtQKV}} {
		if tiles := divCeil(c.n, decodeTailWG/decodeTailLanes*c.rt); tiles > 512 || c.wpt*c.rt > decodeTailWR {
			t.Errorf("%d rows: %d tiles, %d vec4s a thread", c.n, tiles, c.wpt*c.rt)
		}
	}
	if p, ok := planTail(2048, 2048, 6144, 4096, 16); !ok || p.rtGU != 6 || p.rtD != 2 {
		t.Errorf("16 workgroups: %+v, %v: want the most rows the registers take", p, ok)
	}
	if _, ok := planTail(2048, 2048, 32*decodeTailLanes*decodeTailWR+32, 4096, 256); ok {
		t.Error("an intermediate size past the registers was planned")
	}
}
