package reference

import (
	"math"

	"webdraft/internal/parallel"
	"webdraft/qwen3"
	"webdraft/tensor"
	"webdraft/treemask"
)

// MatMul computes out = x·Wᵀ for x (T, in) and W (out, in): out (T, out),
// like nn.Linear without bias. Rows of W are dequantized once each and shared
// by the T inputs; work is split over W's rows.
func MatMul(out, x []float32, w tensor.Matrix, T int) {
	rows, cols := w.Shape()
	parallel.For(rows, 16, func(lo, hi int) {
		row := make([]float32, cols)
		for r := lo; r < hi; r++ {
			w.Row(r, row)
			for t := range T {
				out[t*rows+r] = dot(row, x[t*cols:(t+1)*cols])
			}
		}
	})
}

func dot(a, b []float32) float32 {
	var s float32
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// RMSNorm computes out = x / sqrt(mean(x²) + eps) * weight (Qwen3RMSNorm, in f32).
func RMSNorm(out, x, weight []float32, eps float64) {
	var ss float32
	for _, v := range x[:len(weight)] {
		ss += v * v
	}
	inv := float32(1 / math.Sqrt(float64(ss/float32(len(weight)))+eps))
	for i, wt := range weight {
		out[i] = wt * (x[i] * inv)
	}
}

// Rope rotates one head x (D) at position pos in the split-halves layout:
// x·cos + rotate_half(x)·sin, with rotate_half(x) = (−x[D/2:], x[:D/2]).
func Rope(x []float32, pos int, invFreq []float32) {
	half := len(invFreq)
	for i, f := range invFreq {
		angle := float32(pos) * f // freqs = position * inv_freq, in f32
		sin, cos := math.Sincos(float64(angle))
		c, s := float32(cos), float32(sin)
		x1, x2 := x[i], x[i+half]
		x[i] = x1*c - x2*s
		x[i+half] = x2*c + x1*s
	}
}

// Attention computes GQA attention for the T new queries fed at slots
// P … P+T-1 over the cache (P+T, kv_heads*D): out (T, heads*D). Query t
// attends to the slots rows[t] makes visible (treemask.Row: causal for a
// line token, the line and its ancestors for a tree node). Query head h
// reads key/value head h / (heads/kv_heads) (repeat_kv).
func Attention(out, q, k, v []float32, P int, rows []treemask.Row, c *qwen3.Config) {
	D, heads, qDim, kvDim, group := c.HeadDim, c.NumAttentionHeads, c.QDim(), c.KVDim(), c.GroupSize()
	T := len(rows)
	scale := float32(1 / math.Sqrt(float64(D)))
	parallel.For(T*heads, 4, func(lo, hi int) {
		scores := make([]float32, P+T)
		for th := lo; th < hi; th++ {
			t, h := th/heads, th%heads
			row := rows[t]
			qh := q[t*qDim+h*D : t*qDim+(h+1)*D]
			kvOff := (h / group) * D
			n := P + t + 1 // slots 0 … P+t, those the row sees
			// scores = q·kᵀ · D^-0.5; softmax in f32
			best := float32(math.Inf(-1))
			for j := range n {
				if !row.Visible(j) {
					continue
				}
				scores[j] = dot(qh, k[j*kvDim+kvOff:j*kvDim+kvOff+D]) * scale
				best = max(best, scores[j])
			}
			var sum float32
			for j := range n {
				if !row.Visible(j) {
					continue
				}
				scores[j] = float32(math.Exp(float64(scores[j] - best)))
				sum += scores[j]
			}
			oh := out[t*qDim+h*D : t*qDim+(h+1)*D]
			clear(oh)
			for j := range n {
				if !row.Visible(j) {
					continue
				}
				p := scores[j] / sum
				vj := v[j*kvDim+kvOff : j*kvDim+kvOff+D]
				for i := range oh {
					oh[i] += p * vj[i]
				}
			}
		}
	})
}

// SiLU(x) = x·sigmoid(x).
func SiLU(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

// Add computes x += y.
func Add(x, y []float32) {
	for i := range x {
		x[i] += y[i]
	}
}
