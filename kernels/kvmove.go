package kernels

import (
	"errors"
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var (
	kvMove = gpu.Kernel{
		Module: "kv_move.wgsl", Source: shaders.KVMove, Entry: "main", Params: reflect.TypeFor[kvMoveParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite}, // list, table, kcache, vcache
	}
	kvMoveRows = gpu.Kernel{
		Module: "kv_move.wgsl", Source: shaders.KVMove, Entry: "rows", Params: reflect.TypeFor[kvMoveParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // list, table, one feature buffer (kcache)
	}
)

// kvMoveParams are kv_move.wgsl's params.
type kvMoveParams struct {
	G, KVHeads, DW, BS, MaxBlocks, Moves0 uint32
	_, _                                  uint32
}

// kvMoveWG is WG in kv_move.wgsl.
const kvMoveWG = 64

// RecordMoves records into b, ahead of whatever b records next, the moves
// of every path kept (KVSeq.KeepPath) since the last call — one
// kv_move.wgsl dispatch a layer and one a feature buffer, each sequence's
// moves in its order — and
// clears them; with none pending it records nothing. Their list goes to
// the device now, by a queue write, so b must be submitted before the next
// call. A pass calls it before its kernels, so that they read the moved
// keys and values and write past them.
func (c *KVCache) RecordMoves(b *gpu.Batch) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.moving) == 0 {
		return nil
	}
	if c.closed {
		return errors.New("kernels: kv cache: released")
	}
	seqs := c.moving
	var groups, moves []uint32
	for _, s := range seqs {
		groups = append(groups, uint32(s.slot), uint32(len(moves)/2), uint32(len(s.moves)), 0)
		for _, m := range s.moves {
			moves = append(moves, uint32(m.From), uint32(m.To))
		}
	}
	list := append(groups, moves...)
	if err := c.ensureMoveList(b.Device(), len(list)); err != nil {
		return err
	}
	if err := c.moveList.WriteU32(0, list); err != nil {
		return fmt.Errorf("kernels: kv_move: %w", err)
	}
	if err := c.recordMoves(b, len(seqs), len(groups), len(list)); err != nil {
		return err
	}
	for _, s := range seqs {
		// Made (once b runs): the blocks they read go back, but for those
		// this call's passes reserved.
		s.moves, s.hold = nil, 0
		s.trim()
	}
	c.moving = nil
	return nil
}

// ensureMoveList grows the move list's buffer to at least n words.
func (c *KVCache) ensureMoveList(d *gpu.Device, n int) error {
	if c.moveList != nil && c.moveList.Size() >= uint64(n)*4 {
		return nil
	}
	size := uint64(n) * 4
	if c.moveList != nil {
		size = max(size, 2*c.moveList.Size())
	}
	buf, err := d.NewBuffer("kv.moves", size)
	if err != nil {
		return fmt.Errorf("kernels: kv_move: %w", err)
	}
	if c.moveList != nil {
		c.moveList.Release()
	}
	c.moveList = buf
	return nil
}

// recordMoves records kv_move.wgsl over every layer and every feature
// buffer for G groups whose moves start at word moves0 of the list (words
// in all).
func (c *KVCache) recordMoves(b *gpu.Batch, G, moves0, words int) error {
	op := "kv_move"
	p, err := c.pipeline(b.Device(), kvMove, kernelShape{}, false, func() gpu.Consts { return nil })
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	dw := c.D * c.ElemBytes() / 4
	params := &kvMoveParams{G: uint32(G), KVHeads: uint32(c.KVHeads), DW: uint32(dw), BS: uint32(c.BlockSize),
		MaxBlocks: uint32(c.MaxBlocks), Moves0: uint32(moves0)}
	list := c.moveList.Slice(0, uint64(words)*4)
	for l := range c.Layers {
		kc, vc := c.layer(l)
		if err := gpu.Dispatch(b, p, params, []gpu.Binding{list, c.table.All(), kc, vc}, divCeil(c.KVHeads*dw, kvMoveWG), uint32(G), 1); err != nil {
			return fmt.Errorf("kernels: %s: layer %d: %w", op, l, err)
		}
	}
	if len(c.feat) == 0 {
		return nil
	}
	pr, err := c.pipeline(b.Device(), kvMoveRows, kernelShape{}, false, func() gpu.Consts { return nil })
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	rows := *params
	rows.KVHeads, rows.DW = 1, uint32(c.FeatureWidth)
	for i, f := range c.feat {
		if err := gpu.Dispatch(b, pr, &rows, []gpu.Binding{list, c.table.All(), f.All()}, divCeil(c.FeatureWidth, kvMoveWG), uint32(G), 1); err != nil {
			return fmt.Errorf("kernels: %s: features %d: %w", op, i, err)
		}
	}
	return nil
}
