package ops

// Block is the column block of the layout matrix products read: 32
// columns, the codes of four int4 words.
const Block = 32

// Permute writes src (one row) into dst in the blocked layout: within each
// whole 32-column block, the 16 even columns then the 16 odd ones; a tail
// shorter than a block keeps its order. dst and src must not overlap.
func Permute(dst, src []float32) {
	n := len(src) / Block * Block
	for b := 0; b < n; b += Block {
		s, d := src[b:b+Block], dst[b:b+Block]
		for i := range Block / 2 {
			d[i], d[Block/2+i] = s[2*i], s[2*i+1]
		}
	}
	copy(dst[n:len(src)], src[n:])
}

// Permuted is the index in the blocked layout of column c of a row of n
// columns (Permute's dst[Permuted(c, n)] = src[c]).
func Permuted(c, n int) int {
	if c >= n/Block*Block {
		return c
	}
	b, i := c/Block*Block, c%Block
	return b + i%2*(Block/2) + i/2
}
