package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

// skinny_int4.wgsl: int4 W times a few to some tens of activation rows,
// the weights in registers, the activations broadcast (see its header).
var skinnyInt4 = gpu.Kernel{
	Module: "skinny_int4.wgsl", Source: shaders.SkinnyInt4, Entry: "main", Params: reflect.TypeFor[splitParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly}, // x, qweight, out, norm, scales
}

// The constants skinny_int4.wgsl is specialized by.
var skinnyConsts = []string{"TT", "RT", "WG", "KC", "GS"}

// skinnyLayout is skinny_int4.wgsl's tiling (see its header): tt
// activation rows a workgroup, rt weight rows a thread, wg threads.
type skinnyLayout struct{ tt, rt, wg int }

func (l skinnyLayout) String() string { return fmt.Sprintf("skinny-%dx%d/%d", l.tt, l.rt, l.wg) }

// rows is the weight rows a workgroup computes.
func (l skinnyLayout) rows() int { return l.wg * l.rt }

// valid reports whether the kernel takes the layout: any number of
// activation rows a workgroup that divides its threads (a multiple of 4
// uses whole vec4s; others leave the last one's spare lanes out of the
// multiply-adds).
func (l skinnyLayout) valid() bool {
	return l.tt >= 1 && l.wg >= l.tt && l.wg%l.tt == 0 && l.wg <= 256 && l.rt >= 1 && l.rt <= 4
}

// chunk returns the inputs a chunk (KC) for a device with limit bytes of
// workgroup memory: the most, up to 128, whose staged activations (whole
// vec4s of activation rows) fit it; 0 when none does.
func (l skinnyLayout) chunk(limit uint32) int {
	tv := (l.tt + 3) / 4
	for kc := 128; kc >= 32; kc -= 32 {
		if uint32(4*(kc*4*tv+l.wg+l.tt)) <= limit {
			return kc
		}
	}
	return 0
}

// pickSkinnyLayout returns skinny_int4.wgsl's layout for T activation rows
// of an N-row matrix, the fastest measured on the H200 at Qwen3-1.7B's
// shapes (BenchmarkMatMulKernels), as a rule: two weight rows a thread; 8
// or 16 activation rows a workgroup up to 8 or 16, 32 beyond — but 16 for a
// vocabulary-sized head, whose tiles fill the GPU anyway; 64 threads, or
// more for tall matrices (gate|up, the head) — and 256 for prompt chunks of
// 256 rows and more, which have tiles enough for any matrix (64 rows a
// workgroup or four weight rows a thread were slower at every projection).
// A verification's k + 1 rows between the powers of two take tiles of 12
// (9–12 rows, 96 threads) and 20 (17–20, 240 threads; the head keeps 16),
// which pad less — or, where the plan says so (exactSkinnyTiles), rows
// from 5 to 20 that are no multiple of 4 take a tile of exactly their rows
// (exactSkinnyLayout), which spends no multiply-adds on padding: at
// Qwen3-8B's shapes (-benchshape qwen3-8b
// -benchts 5,9,17 -cold, 2026-12-03) q|k|v, o, gate|up, down and the head
// took 32.7 / 27.5 / 82.9 / 52.3 / 408 µs at 5 rows against 36.9 / 30.4 /
// 101 / 63.8 / 521 in tiles of 8, and at 9 rows 42.4 / 32.0 / 110 / 62.9 /
// 529 against 42.1 / 36.5 / 120 / 71.1 / 774 in tiles of 12 (the head's
// 16); at 17 rows 54–158 µs against 57–162 in tiles of 20, the head 820
// (its 320 tiles split in two along K, the plan's skinnyGroups) against
// 1,366 in tiles of 16. Three or four rows (the plan's large
// matrices) take tiles of 4 rows and 128 threads: 40–332 µs at Qwen3-8B's
// down_proj, gate|up and head against 66–512 at 8 rows a tile (tiles of
// exactly 3 were no faster: 40–304 against 40–313).
func pickSkinnyLayout(n, T int) skinnyLayout {
	tall := n >= 8192
	wg := 64
	if tall {
		wg = 128
	}
	switch {
	case T >= 256 && n < 65536:
		return skinnyLayout{tt: 32, rt: 2, wg: 256}
	case T <= 4:
		return skinnyLayout{tt: 4, rt: 2, wg: 128}
	case T <= 8:
		return skinnyLayout{tt: 8, rt: 2, wg: wg}
	case T <= 12:
		return skinnyLayout{tt: 12, rt: 2, wg: 96}
	case T <= 16 || n >= 65536:
		return skinnyLayout{tt: 16, rt: 2, wg: wg}
	case T <= 20:
		return skinnyLayout{tt: 20, rt: 2, wg: 240}
	case tall:
		return skinnyLayout{tt: 32, rt: 2, wg: 256}
	}
	return skinnyLayout{tt: 32, rt: 2, wg: 128}
}

// skinnyLayout returns the plan's skinny_int4.wgsl layout for T rows of an
// n-row matrix: pickSkinnyLayout's, or with exactSkinnyTiles a tile of
// exactly T rows for 5–20 rows that are no multiple of 4.
func (p *plan) skinnyLayout(n, T int) skinnyLayout {
	if p.exactSkinnyTiles && exactTileRows(T) {
		return exactSkinnyLayout(T)
	}
	return pickSkinnyLayout(n, T)
}

// exactTileRows reports whether T rows take a tile of exactly T rows where
// the plan says so (plan.exactSkinnyTiles): 5–20 rows, no multiple of 4.
func exactTileRows(T int) bool { return T >= 5 && T <= 20 && T%4 != 0 }

// exactSkinnyLayout is the layout of a tile of exactly T rows (5 ≤ T ≤ 20):
// two weight rows a thread, and as many threads, a multiple of T, as fit
// 128 (T ≤ 8), 144 (9–16) or 240 (17–20).
func exactSkinnyLayout(T int) skinnyLayout {
	limit := 240
	switch {
	case T <= 8:
		limit = 128
	case T <= 16:
		limit = 144
	}
	return skinnyLayout{tt: T, rt: 2, wg: T * (limit / T)}
}

// skinny records one row block with skinny_int4.wgsl at the choice's
// layout and split-K target.
func (c *matMulCall) skinny(blk rowBlock, out gpu.Binding) error {
	l := c.choice.skinny
	kc := l.chunk(c.b.Device().Limits().MaxComputeWorkgroupStorageSize)
	if !l.valid() || kc == 0 {
		return fmt.Errorf("%v does not fit this device", l)
	}
	p, err := c.pipeline(skinnyInt4, skinnySpec(l, kc, c.choice.groupScale))
	if err != nil {
		return err
	}
	return c.splitDispatch(p, blk, out, l.rows(), l.tt, 32, c.choice.groups)
}

// skinnySpec is skinny_int4.wgsl's specialization for layout l, kc
// columns a chunk and the group-scale flag.
func skinnySpec(l skinnyLayout, kc int, groupScale bool) specialization {
	return specialization{skinnyConsts, [6]uint32{uint32(l.tt), uint32(l.rt), uint32(l.wg), uint32(kc), wgslBool(groupScale)}}
}
