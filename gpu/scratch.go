package gpu

// Scratch returns a buffer of at least size bytes for data that lives only
// between the dispatches of one operation (a split-K matmul's partial sums,
// written by one dispatch and summed by the next). There is one such buffer
// per device, shared by every caller and grown on demand: what an operation
// leaves there is overwritten by the next one. Dispatches run in the order
// recorded, so consecutive operations never see each other's data.
//
// A grown-out buffer is kept until Close rather than released, since
// batches still recording may have bound it (growth doubles, so this at
// most doubles the memory).
func (d *Device) Scratch(size uint64) (*Buffer, error) {
	if d.scratch != nil && d.scratch.Size() >= size {
		return d.scratch, nil
	}
	if d.scratch != nil {
		size = max(size, 2*d.scratch.Size())
	}
	b, err := d.NewBuffer("scratch", size)
	if err != nil {
		return nil, err
	}
	if d.scratch != nil {
		d.retired = append(d.retired, d.scratch)
	}
	d.scratch = b
	return b, nil
}

// releaseScratch frees the scratch buffers (Close).
func (d *Device) releaseScratch() {
	for _, b := range append(d.retired, d.scratch) {
		if b != nil {
			b.Release()
		}
	}
	d.scratch, d.retired = nil, nil
}
