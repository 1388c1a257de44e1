package tensor

import (
	"math"

	"github.com/x448/float16"
)

// F16ToF32 widens IEEE half bits to f32 (exact).
func F16ToF32(h uint16) float32 { return float16.Frombits(h).Float32() }

// F32ToF16 rounds f32 to the nearest IEEE half (ties to even), as PyTorch's
// .to(torch.float16) does; overflow gives ±Inf.
func F32ToF16(f float32) uint16 { return float16.Fromfloat32(f).Bits() }

// BF16ToF32 widens bfloat16 bits to f32 (exact: bf16 is the top half of f32).
func BF16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }
