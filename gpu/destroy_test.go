package gpu

// Destroy destroys the buffer's memory at once, as WebGPU's destroy()
// does, before Release drops it: a buffer gone while a batch still uses
// it, which only the device sees.
func (b *Buffer) Destroy() { b.buf.Destroy() }
