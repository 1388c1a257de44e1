//go:build !(goexperiment.simd && amd64)

package ops

// Without simd/archsimd (another architecture, or a toolchain without
// GOEXPERIMENT=simd) every kernel is the portable one.

// Vector reports which kernels run: "portable" here.
func Vector() string { return "portable" }

func int4Row(codes []byte, scales []uint16, bps int, x []float32, cols, T int, out []float32, ld int, add bool) {
	int4RowGo(codes, scales, bps, x, cols, T, out, ld, add)
}

// Dot is Σ a[i]·b[i] over len(a) (b at least as long).
func Dot(a, b []float32) float32 { return dotGo(a, b) }

// Axpy is y += a·x over len(y) (x at least as long).
func Axpy(y []float32, a float32, x []float32) { axpyGo(y, a, x) }

// ExpSum sets x[i] = exp(x[i] − m) and returns their sum.
func ExpSum(x []float32, m float32) float32 { return expSumGo(x, m) }

// ExpSumFrom is Σ exp(x[i] − m), x unchanged.
func ExpSumFrom(x []float32, m float32) float32 { return expSumFromGo(x, m) }

// Max is the largest value of a non-empty x and its first index; nan
// reports a NaN in x.
func Max(x []float32) (float32, int, bool) { return maxGo(x) }

// SiLUMul sets g[i] = SiLU(g[i])·u[i] (the MLP's act_fn(gate)·up).
func SiLUMul(g, u []float32) { siluMulGo(g, u) }

func int4Dot1x4(codes []byte, scales []uint16, bps int, x []float32) (float32, float32, float32, float32) {
	return int4Dot1x4Go(codes, scales, bps, x)
}

func fmaLoop(n int) float64 { return fmaLoopGo(n) }

// int4Tiles takes no rows here: the per-row kernels do them all.
func int4Tiles(codes []byte, scales []uint16, bps, cols int, x []float32, T int, out []float32, ld, lo, hi int, add bool, scratch []float32) int {
	return lo
}

// Attend computes one query head's attention over n cached positions:
// out = softmax(q·kⱼ·scale)·vⱼ, key j at keys[j·stride:], value j at
// values[j·stride:], both len(q) long; scores holds n floats of scratch.
func Attend(out, q, keys, values []float32, stride, n int, scale float32, scores []float32, mask Mask) {
	attendGo(out, q, keys, values, stride, n, scale, scores, mask)
}

// useFixed: the fixed-point kernel is amd64 assembly, as is the
// screening one.
var useFixed, hasFixed, hasScreen = false, false, false

func quantize(dst []byte, row []float32) { quantizeGo(dst, row) }

func (l *Linear) mulFixed(out []float32, ld int, in *Input, lo, hi int, add bool) {
	panic("ops: the fixed-point kernel is not built on this platform")
}

// Screen is the screening kernel (screen.go), amd64 assembly.
func (l *Linear) Screen(out []float32, ld int, in *Input, lo, hi int) {
	panic("ops: the screening kernel is not built on this platform")
}

// ExpScaled sets e[i] = exp((x[i] − m) / t) — a softmax's numerators at
// temperature t > 0, m at least every x[i] — and returns their sum and
// the largest x[i].
func ExpScaled(e, x []float32, m, t float32) (sum, top float32) { return expScaledGo(e, x, m, t) }

// AtLeast is Σ e[i] over the i where x[i] ≥ v, and how many there are.
func AtLeast(e, x []float32, v float32) (sum float32, n int) { return atLeastGo(e, x, v) }

// HashBelow appends to dst, in order, base + i for the i where h·2⁻³² ≤
// lim[i], h token i's coupled-noise hash under the key (k0, k1) —
// sampling.Gumbel's: three keyed rounds of sampling.Mix32 over tokens[i],
// or base + i where tokens is nil. A token's noise is at most
// −log(h·2⁻³²), so only these can lift a logit by −log lim[i].
func HashBelow(dst []int32, lim []float32, tokens []int32, base int, k0, k1 uint32) []int32 {
	return hashBelowGo(dst, lim, tokens, base, k0, k1)
}

// FirstAtLeast is the index of the first x[i] ≥ v, len(x) if there is
// none (a NaN is never ≥ v).
func FirstAtLeast(x []float32, v float32) int { return firstAtLeastGo(x, v) }

// KeepAtLeast sets e[i] = 0 where x[i] < v and returns Σ e.
func KeepAtLeast(e, x []float32, v float32) float32 { return keepAtLeastGo(e, x, v) }

// Between moves the pairs (x[i], e[i]) with lo ≤ x[i] < hi to the front
// of dx and de, in order, and returns how many. dx and de may be x and e;
// else they are at least len(x) + 16 long.
func Between(dx, de, x, e []float32, lo, hi float32) int { return betweenGo(dx, de, x, e, lo, hi) }

// Residual sets r[i] = max(0, p[i]·a − q[i]·b) over len(r) and returns
// Σ r; r may be p.
func Residual(r, p []float32, a float32, q []float32, b float32) float32 {
	return residualGo(r, p, a, q, b)
}

// Scale sets y[i] = x[i]·a over len(y) and returns Σ y; y may be x.
func Scale(y, x []float32, a float32) float32 { return scaleGo(y, x, a) }

// SumMin is Σ x and the smallest x[i] (+Inf for an empty x): a NaN makes
// the sum NaN.
func SumMin(x []float32) (sum, least float32) { return sumMinGo(x) }

// RangeInt32 is the smallest and largest of a non-empty x (a list of
// tokens' bounds).
func RangeInt32(x []int32) (lo, hi int32) { return rangeInt32Go(x) }
