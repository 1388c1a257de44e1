package sampling

import "math"

// Coupled draws: drafter-invariant speculative sampling by shared
// randomness (Daliri, Musco and Suresh, "Coupling without Communication
// and Drafter-Invariant Speculative Decoding", 2024). A coupled row's key —
// the bits of its Draw's U and V — fixes a Gumbel noise g_t for every
// token t of the vocabulary (Gumbel). The target's token is the Gumbel-max
// draw, the kept token with the largest logit/T + g_t, which follows p
// exactly whatever the drafter did; a drafter that proposes the largest
// q-logit/T + g_t under the same key proposes a token drawn from its own
// q, and the two agree with probability close to 1 − TV(p, q), where a
// greedy proposal is accepted with probability p(x). A proposal is
// accepted iff it is the target's token, so a chain of coupled rows is
// accepted by comparing tokens, as a greedy one is, and what comes out is
// the target's draw at every position. Each row needs a fresh key; the
// tokens it decides are decided once.

// Key returns a coupled draw's key: its uniforms' bits.
func (d Draw) Key() (k0, k1 uint32) { return math.Float32bits(d.U), math.Float32bits(d.V) }

// Mix32 is a 32-bit finalizer with full avalanche (lowbias32, Chris
// Wellons' hash prospector), as prelude.wgsl's mix32: Gumbel's hash is
// three keyed rounds of it.
func Mix32(x uint32) uint32 {
	x ^= x >> 16
	x *= 0x7feb352d
	x ^= x >> 15
	x *= 0x846ca68b
	x ^= x >> 16
	return x
}

// Gumbel is token t's noise under key (k0, k1): −log E, E = −log(1 − w)
// an exponential variate, w = (h + ½)·2⁻³² (at most the largest f32 below
// 1) for h, three keyed rounds of Mix32 over t — prelude.wgsl's gumbel,
// which computes E in f32 (by its series where w < 2⁻⁶). w resolves its
// small values to 2⁻³², so the upper tail, where a row's largest noisy
// logits come from, is not coarse: the noise is finite and at most
// MaxGumbel.
func Gumbel(k0, k1 uint32, t int) float32 {
	h := Mix32(uint32(t) ^ k0)
	h = Mix32(h + k1)
	return gumbelOf(Mix32(h ^ k0))
}

// gumbelOf is the noise of a hash h (Gumbel); it falls as h grows.
func gumbelOf(h uint32) float32 {
	w := min((float32(h)+0.5)*(1.0/4294967296), 0x1.fffffep-1)
	return float32(-math.Log(-math.Log1p(-float64(w))))
}

// MaxGumbel is the largest noise Gumbel gives (at h = 0: about 22.87), so
// a token whose logit/T + MaxGumbel falls below another's noisy logit
// cannot be a row's Gumbel-max draw.
var MaxGumbel = gumbelOf(0)

// CoupledChoice is a drafter's coupled proposal from a row of logits at
// temperature T > 0 under key d: the index i with the largest
// logits[i]/T + Gumbel(key, token(i)), token(i) being tokens[i] for a head
// over part of the vocabulary (nil: i itself), the lower token on a tie,
// scaled in f32 as on the GPU. A NaN anywhere is ErrNaN.
func CoupledChoice(logits []float32, tokens []int32, T float32, d Draw) (int, error) {
	for _, l := range logits {
		if l != l {
			return 0, ErrNaN
		}
	}
	return gumbelMax(logits, tokens, T, d, nil), nil
}

// gumbelMax is the index i, among those in(i) (nil: all), with the largest
// logits[i]/T + Gumbel(key, token(i)), the lower token on a tie: Choose's
// draw for a coupled row (in: the nucleus) and CoupledChoice's.
func gumbelMax(logits []float32, tokens []int32, T float32, d Draw, in func(int) bool) int {
	k0, k1 := d.Key()
	best, at, tok := float32(math.Inf(-1)), -1, 0
	for i, l := range logits {
		if in != nil && !in(i) {
			continue
		}
		t := i
		if tokens != nil {
			t = int(tokens[i])
		}
		if v := l/T + Gumbel(k0, k1, t); at < 0 || v > best || v == best && t < tok {
			best, at, tok = v, i, t
		}
	}
	return at
}
