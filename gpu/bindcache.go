package gpu

import (
	"encoding/binary"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

// bindCache keeps bind groups across batches. Creating one costs wgpu-native
// several microseconds of CPU — on the H200 host more than the GPU needs for
// a layer-sized kernel — while a forward pass makes the same few hundred
// every time: same pipeline, same buffers, same ranges. Params are bound
// with a dynamic offset, so where they sit in their uniform chunk does not
// matter.
//
// A group is keyed by its layout and each binding's buffer, offset and size;
// it is dropped when one of its buffers is released. The entry holds the
// buffers, so an address in a key cannot be reused while the entry lives.
type bindCache struct {
	groups   map[string]*cachedGroup
	byBuffer map[*wgpu.Buffer][]string
	// retired groups wait for the batches being recorded, which may use
	// them, to end: wgpu-native aborts on a pass whose group was released.
	retired []*wgpu.BindGroup
	open    int    // batches being recorded
	buf     []byte // the key being looked up, reused
	// epoch counts the groups dropped: a Recording made at one epoch names
	// only groups that are still alive while the epoch is the same.
	epoch uint64
	// onRelease, when set, is told of each group released.
	onRelease func(*wgpu.BindGroup)
}

type cachedGroup struct {
	group   *wgpu.BindGroup
	buffers []*wgpu.Buffer
}

// maxCachedGroups bounds the cache; past it the cache starts over (a forward
// pass needs a few hundred, one per distinct batch shape).
const maxCachedGroups = 1 << 15

func newBindCache() *bindCache {
	return &bindCache{groups: map[string]*cachedGroup{}, byBuffer: map[*wgpu.Buffer][]string{}}
}

// key names a bind group: the layout, then (buffer, offset, size) per
// entry, as raw 8-byte words. It is built in c.buf, reused: a lookup that
// hits allocates nothing (every dispatch makes one).
func (c *bindCache) key(bgl *wgpu.BindGroupLayout, entries []wgpu.BindGroupEntry) []byte {
	k := binary.LittleEndian.AppendUint64(c.buf[:0], uint64(uintptr(unsafe.Pointer(bgl))))
	for _, e := range entries {
		k = binary.LittleEndian.AppendUint64(k, uint64(uintptr(unsafe.Pointer(e.Buffer))))
		k = binary.LittleEndian.AppendUint64(k, e.Offset)
		k = binary.LittleEndian.AppendUint64(k, e.Size)
	}
	c.buf = k
	return k
}

// get returns the cached group for entries, creating it on a miss.
func (c *bindCache) get(dev *wgpu.Device, label string, bgl *wgpu.BindGroupLayout, entries []wgpu.BindGroupEntry) (*wgpu.BindGroup, error) {
	k := c.key(bgl, entries)
	if g, ok := c.groups[string(k)]; ok {
		return g.group, nil
	}
	key := string(k)
	if len(c.groups) >= maxCachedGroups {
		c.clear()
	}
	group, err := dev.CreateBindGroup(&wgpu.BindGroupDescriptor{Label: label, Layout: bgl, Entries: entries})
	if err != nil {
		return nil, err
	}
	g := &cachedGroup{group: group}
	for _, e := range entries {
		g.buffers = append(g.buffers, e.Buffer)
		c.byBuffer[e.Buffer] = append(c.byBuffer[e.Buffer], key)
	}
	c.groups[key] = g
	return group, nil
}

// forget drops every group that binds buf (before buf is released).
func (c *bindCache) forget(buf *wgpu.Buffer) {
	for _, key := range c.byBuffer[buf] {
		if g, ok := c.groups[key]; ok {
			c.retire(g.group)
			delete(c.groups, key)
		}
	}
	delete(c.byBuffer, buf)
}

// clear drops every group.
func (c *bindCache) clear() {
	for _, g := range c.groups {
		c.retire(g.group)
	}
	clear(c.groups)
	clear(c.byBuffer)
}

func (c *bindCache) retire(g *wgpu.BindGroup) {
	c.epoch++
	c.retired = append(c.retired, g)
	c.release()
}

// begin and end bracket the recording of a batch.
func (c *bindCache) begin() { c.open++ }

func (c *bindCache) end() {
	c.open--
	c.release()
}

// release frees retired groups once no batch is being recorded.
func (c *bindCache) release() {
	if c.open > 0 {
		return
	}
	for _, g := range c.retired {
		if c.onRelease != nil {
			c.onRelease(g)
		}
		g.Release()
	}
	c.retired = c.retired[:0]
}
