package gpu

import "fmt"

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

// CountedScratch returns a second scratch buffer, for a dispatch whose
// workgroups count their arrivals (see DeviceScopeBarrier), and the byte
// offset at which its scratch space of at least size bytes starts. Before
// that offset lie at least counters u32 counters, zero between dispatches:
// a kernel that counts arrivals in one must set it back to zero (the last
// workgroup to arrive does), so that the next dispatch finds it so. The
// scratch space after them is overwritten by each operation, as Scratch's.
//
// Growing the counters moves the scratch space, so a new buffer (zeroed)
// is made rather than counters reused from old scratch bytes.
func (d *Device) CountedScratch(counters int, size uint64) (*Buffer, uint64, error) {
	if counters < 0 {
		return nil, 0, fmt.Errorf("gpu: counted scratch: %d counters", counters)
	}
	n := alignUp(uint64(counters), minCounters)
	if d.counted != nil && n <= d.counters && d.counted.Size() >= 4*d.counters+size {
		return d.counted, 4 * d.counters, nil
	}
	if d.counted != nil {
		n = max(n, d.counters)
		size = max(size, 2*(d.counted.Size()-4*d.counters))
	}
	b, err := d.NewBuffer("counted_scratch", 4*n+size)
	if err != nil {
		return nil, 0, err
	}
	if d.counted != nil {
		d.retired = append(d.retired, d.counted)
	}
	d.counted, d.counters = b, n
	return b, 4 * n, nil
}

// minCounters is CountedScratch's smallest counter region, in u32s: a whole
// number of 256-byte storage offset alignments.
const minCounters = 1024

// releaseScratch frees the scratch buffers (Close).
func (d *Device) releaseScratch() {
	for _, b := range append(d.retired, d.scratch, d.counted) {
		if b != nil {
			b.Release()
		}
	}
	d.scratch, d.counted, d.retired = nil, nil, nil
}
