package ops

import "webdraft/tensor"

// f16 widens every IEEE half to f32: a kernel's scale is one load (the
// table, 256 KiB, stays in cache).
var f16 = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = tensor.F16ToF32(uint16(i))
	}
	return &t
}()
