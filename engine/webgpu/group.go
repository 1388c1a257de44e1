package webgpu

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
)

// Group is engines on one gpu.Device that work together — a drafter and
// its target, or a target and its EAGLE-3 head (NewHead). Their calls take
// one lock (a device is used by one
// goroutine at a time, package gpu), a fault of one breaks them all (the
// device's state is unknown), and they share a Q store: where a drafter's
// sampled proposals keep their distributions (VerifyRow.Q, a *DeviceDist),
// for a target of the group to hold them to the multi-draft rule without
// the distributions leaving the device. A target refuses a DeviceDist of
// another group.
type Group struct {
	mu         sync.Mutex // held by every call of the group's engines
	dev        *gpu.Device
	ownsDevice bool  // the device closes with the group (OpenGroup)
	engines    int   // open engines
	open       bool  // Close not called yet
	fault      error // the first pass the device failed, for every engine of the group
	q          qStore
}

// NewGroup returns a group of engines on dev, which stays its caller's.
func NewGroup(dev *gpu.Device) *Group {
	g := &Group{dev: dev, open: true}
	g.q.g = g
	return g
}

// OpenGroup opens the best WebGPU adapter as opts says (gpu.ErrNoAdapter
// when there is none) for a group that owns the device: it closes once
// the group is closed and its last engine is.
func OpenGroup(opts gpu.Options) (*Group, error) {
	dev, err := gpu.Open(opts)
	if err != nil {
		return nil, err
	}
	g := NewGroup(dev)
	g.ownsDevice = true
	return g, nil
}

// Device is the group's device.
func (g *Group) Device() *gpu.Device { return g.dev }

// New uploads w to the group's device and allocates the engine's KV cache
// and activations.
func (g *Group) New(cfg qwen3.Config, w *qwen3.Weights, opts Options) (*Engine, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case !g.open:
		return nil, errors.New("webgpu engine group: closed")
	case g.fault != nil:
		return nil, g.fault
	}
	e, err := build(g, cfg, w, opts)
	if err != nil {
		return nil, err
	}
	g.engines++
	return e, nil
}

// Close gives up the caller's hold on the group: no engine is added to it
// afterwards, and the device, when the group opened it, closes with the
// last of its engines (now, when none is open). Its engines stay open.
func (g *Group) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = false
	g.release()
}

// closeMember closes one of the group's engines — the target or a head —
// once: it marks it closed, frees its resources (free) and lets the group
// release what nothing uses any more.
func (g *Group) closeMember(closed *bool, free func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if *closed {
		return
	}
	*closed = true
	free()
	g.engines--
	g.release()
}

// release frees what the group holds once nothing uses it (the caller
// holds g.mu): the Q store with the last engine, the device when the
// group is closed too and owns it.
func (g *Group) release() {
	if g.engines > 0 {
		return
	}
	g.q.release()
	if !g.open && g.dev != nil {
		if g.ownsDevice {
			g.dev.Close()
		}
		g.dev = nil
	}
}

// qStore is a group's Q store: drafters' distributions q, a row of V f32 a
// slot, (slots, V), in a ring. A drafter's Verify takes a slot for each
// row it draws proposals from (kernels.Propose writes q there) and hands
// out a DeviceDist naming the slot and its stamp; a target's Verify reads
// the slots of its trees' nodes (kernels.TreeWalk). A slot taken again gets
// a new stamp, and a DeviceDist whose stamp is no longer its slot's is
// refused (ErrStaleDist).
//
// The invariant: a verification that reads the store (a Verify with a
// Tree) consumes every slot taken before it. The ring never takes again a
// slot taken since the last such verification — it grows instead, up to
// what one storage binding holds — so that a drafter's proposals of a
// step (any number of drafter passes, a tree's levels) stay valid until
// the target's verification of that step, and the slots of earlier steps
// are reused. A drafter that proposes more than the largest store holds
// between verifications is refused (ErrQStoreFull); a Dist kept past the
// next step's proposals may be stale by the time it is verified.
type qStore struct {
	g     *Group
	buf   *gpu.Buffer // (len(stamp), V) f32; nil until the first slot is taken
	V     int
	stamp []uint64 // each slot's stamp: the count of slots taken when it was taken
	taken uint64   // slots taken so far
	next  int      // the slot the ring takes next
	held  int      // slots taken since the last verification that read the store
}

// qStoreFirstSlots is the Q store's first size: a chain of 16 drafted
// tokens, or a 16-node tree, for one sequence (608 KiB a slot at 151,936
// tokens); it doubles as drafters need more.
const qStoreFirstSlots = 16

var (
	// ErrStaleDist reports a DeviceDist whose slot of the Q store has been
	// taken again since: the drafter proposed again before the target
	// verified it.
	ErrStaleDist = errors.New("webgpu engine: a drafter's distribution overwritten by later proposals (verify each step's proposals before the next step's)")
	// ErrQStoreFull reports proposals that the Q store cannot keep: more
	// unverified than one storage binding holds.
	ErrQStoreFull = errors.New("webgpu engine: the Q store is full of unverified proposals")
)

// take returns n slots for distributions, none of them one that keep says
// must be kept (this verification's own trees' slots): taken since the last
// verification that read the store, or kept. consume first marks every
// earlier slot consumed (a verification that reads the store).
func (s *qStore) take(n int, V int, consume bool, keep map[int]bool) ([]int, error) {
	if consume {
		s.held = 0
	}
	if n == 0 {
		return nil, nil
	}
	if s.buf != nil && V != s.V {
		return nil, fmt.Errorf("webgpu engine: distributions over %d tokens into a Q store of %d-token rows (engines of one group share a vocabulary)", V, s.V)
	}
	free := func() bool { // the next n slots may be taken
		if s.buf == nil || s.held+n > len(s.stamp) {
			return false
		}
		for i := range n {
			if keep[(s.next+i)%len(s.stamp)] {
				return false
			}
		}
		return true
	}
	if !free() {
		if err := s.grow(n, V); err != nil {
			return nil, err
		}
	}
	slots := make([]int, n)
	for i := range slots {
		slots[i] = s.next
		s.taken++
		s.stamp[s.next] = s.taken
		s.next = (s.next + 1) % len(s.stamp)
	}
	s.held += n
	return slots, nil
}

// grow makes room for n more slots after the held ones: a store twice as
// large (at least held + n slots), its rows copied on the device, the ring
// going on in the new slots.
func (s *qStore) grow(n, V int) error {
	d := s.g.dev
	row := uint64(V) * 4
	most := int(min(d.Limits().MaxStorageBufferBindingSize, d.Limits().MaxBufferSize) / row)
	most &^= 3 // whole 16-byte words: the copy moves them
	old := len(s.stamp)
	slots := min(max(qStoreFirstSlots, 2*old, (old+n+3)&^3), most)
	if slots < old+n {
		return fmt.Errorf("%w: a store of %d-token rows (%d in one storage binding at most) cannot keep %d distributions more beside %d not yet verified",
			ErrQStoreFull, V, most, n, s.held)
	}
	buf, err := d.NewBuffer("q_store", uint64(slots)*row)
	if err != nil {
		return fmt.Errorf("webgpu engine: Q store: %w", err)
	}
	if s.buf != nil {
		b, err := d.NewBatch("q_store_grow")
		if err == nil {
			if err = kernels.Copy(b, buf, s.buf, uint64(old)*row); err != nil {
				b.Discard()
			} else {
				err = b.Submit()
			}
		}
		if err != nil {
			buf.Release()
			return fmt.Errorf("webgpu engine: growing the Q store: %w", err)
		}
		s.buf.Release()
	}
	s.buf, s.V = buf, V
	s.stamp = append(s.stamp, make([]uint64, slots-old)...)
	s.next = old
	return nil
}

// slot returns d's slot when d is this store's and still holds what the
// drafter wrote.
func (s *qStore) slot(d *DeviceDist) (int, error) {
	if d.s != s {
		return 0, errors.New("a distribution kept in another engine group's Q store: open the drafter and the target in one webgpu.Group")
	}
	if s.buf == nil || d.slot >= len(s.stamp) || s.stamp[d.slot] != d.stamp {
		return 0, ErrStaleDist
	}
	return d.slot, nil
}

// release frees the store (the group's last engine closed). The stamps
// go on counting: a DeviceDist of the store freed never names a slot of
// the next one.
func (s *qStore) release() {
	if s.buf != nil {
		s.buf.Release()
	}
	*s = qStore{g: s.g, taken: s.taken}
}

// DeviceDist is a drafter's distribution q kept on the device (engine.
// Dist): a row of its engine group's Q store, which the group's targets
// read where they verify proposals drawn from it. It is valid until the
// store's ring takes its slot again (see Group: after the verification of
// its step, once the next steps' proposals come round to it).
type DeviceDist struct {
	s     *qStore
	slot  int
	stamp uint64
	v     int // the store's row length when the slot was taken
}

var _ engine.Dist = (*DeviceDist)(nil)

// Len is the vocabulary's size: q is kept densely over it.
func (d *DeviceDist) Len() int { return d.v }

// Read copies q to the host (tests, tools): ErrStaleDist once the slot has
// been taken again.
func (d *DeviceDist) Read() ([]float32, error) {
	g := d.s.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, err := d.s.slot(d); err != nil {
		return nil, err
	}
	raw, err := d.s.buf.Read(uint64(d.slot*d.s.V)*4, uint64(d.s.V)*4)
	if err != nil {
		return nil, err
	}
	q := make([]float32, d.s.V)
	for i, w := range u32s(raw) {
		q[i] = math.Float32frombits(w)
	}
	return q, nil
}
