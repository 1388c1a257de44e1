package sampling

// Keys are a sampled generation's coupled keys, a key a position: the row
// that decides the token at position pos (the prompt's tokens at 0 …
// len(prompt) − 1) draws coupled under At(pos), whatever drafted it, and
// only that row's draw decides that token. So the tokens a seed gives are
// the target's Gumbel-max draws at their positions, the same with
// speculation as without, for any drafter, draft length or batch (the
// drafter-invariance of Daliri, Musco and Suresh, 2024), and each follows
// p exactly: a row read out under a key whose prefix is later rejected
// decides nothing, and the position's token is drawn afresh under its key
// once its prefix is the context's. prelude.wgsl's position_key computes
// the same keys on the device, for chained steps whose positions the host
// does not know.
type Keys struct{ S0, S1 uint32 }

// NewKeys returns the keys of seed.
func NewKeys(seed uint64) Keys { return Keys{S0: uint32(seed), S1: uint32(seed >> 32)} }

// At returns the coupled draw, without a proposal, of the row that decides
// the token at position pos: its key's two words are the bits of floats
// in [0, 1) of 24 random bits each, as the uniforms of an uncoupled draw.
func (k Keys) At(pos int) Draw {
	u, v := PositionKey(k.S0, k.S1, uint32(pos))
	return Draw{X: NoProposal, U: u, V: v, Coupled: true}
}

// PositionKey is the key of position pos under seed words (s0, s1), as
// two floats in [0, 1): prelude.wgsl's position_key.
func PositionKey(s0, s1, pos uint32) (float32, float32) {
	a := Mix32(s0 ^ Mix32(pos^Mix32(s1+0x9e3779b9)))
	b := Mix32(s1 ^ Mix32(a^pos))
	return float32(a>>8) / (1 << 24), float32(b>>8) / (1 << 24)
}
