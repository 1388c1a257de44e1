package samplingtest

import (
	"math"
	"math/rand/v2"

	"webdraft/sampling"
)

// ExtremeHashes are hashes at the ends of the coupled noise's range and at
// its seams (sampling.Gumbel): 0 (the largest noise), the two sides of
// w = 2⁻⁶ (where the GPU's series gives way to a logarithm), the top 24
// bits all set (where u = (h + ½)·2⁻²⁴ once rounded to 1) and the largest
// hash (w clamped below 1: the smallest noise).
var ExtremeHashes = []uint32{0, 1, 1<<26 - 1, 1 << 26, 0xffffff00, 0xffffff80, 0xffffffff}

// DrawHashing returns a coupled draw proposing x whose key gives token t
// the hash h (sampling.Gumbel's), its U and V uniforms in [0, 1) as every
// draw's are: U is drawn from rng until the V that the hash's inverse
// gives is one.
func DrawHashing(rng *rand.Rand, t int, h uint32, x int) sampling.Draw {
	for {
		u := rng.Float32()
		k0 := math.Float32bits(u)
		// h = Mix32(Mix32(Mix32(t ^ k0) + k1) ^ k0), so
		// k1 = Mix32⁻¹(Mix32⁻¹(h) ^ k0) − Mix32(t ^ k0).
		k1 := unmix32(unmix32(h)^k0) - sampling.Mix32(uint32(t)^k0)
		if v := math.Float32frombits(k1); v >= 0 && v < 1 && k1>>31 == 0 {
			return sampling.Draw{X: x, U: u, V: v, Coupled: true}
		}
	}
}

// unmix32 is sampling.Mix32's inverse.
func unmix32(x uint32) uint32 {
	x ^= x >> 16
	x *= inverse(0x846ca68b)
	x ^= x>>15 ^ x>>30
	x *= inverse(0x7feb352d)
	x ^= x >> 16
	return x
}

// inverse is odd m's inverse modulo 2³² (Newton's iteration: each step
// doubles the bits that are right).
func inverse(m uint32) uint32 {
	x := m
	for range 5 {
		x *= 2 - m*x
	}
	return x
}
