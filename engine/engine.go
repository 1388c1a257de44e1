// Package engine defines what a drafting backend does — forward passes of a
// Qwen3 model over batches of sequences, each with its own KV cache, returning
// greedy tokens only — and provides the CPU engine over the reference model.
// The WebGPU engine implements the same interface, so the server and the
// command line never see a kernel.
package engine

import (
	"context"
	"errors"
	"fmt"

	"webdraft/qwen3"
)

// Info names what an engine runs on.
type Info struct {
	Backend string // "cpu" or "webgpu"
	Adapter string // the GPU adapter, or the CPU description
}

// Engine runs forward passes over batches of sequences.
//
// An Engine is driven by one goroutine at a time (the server's scheduler, or
// a command); Sequences belong to the engine that made them.
type Engine interface {
	Config() qwen3.Config
	Info() Info
	// NewSequence returns an empty sequence.
	NewSequence() (Sequence, error)
	// Step runs one forward pass over every entry of the batch: each entry's
	// tokens are appended to its sequence's cache, and entry.Next is set to
	// the greedy token after its last one.
	Step(ctx context.Context, batch []*Entry) error
	// KVCapacity is how many positions the engine's KV cache holds for all
	// its sequences together: the scheduler keeps within it.
	KVCapacity() int
	Close() error
}

// Sequence is one sequence's KV cache inside an engine.
type Sequence interface {
	// Len is the number of cached positions.
	Len() int
	// Truncate drops positions from n on (a rejected draft rolls back).
	Truncate(n int)
	// Release frees the cache; the sequence must not be used afterwards.
	Release()
}

// Entry is one sequence's part of a batched forward pass.
type Entry struct {
	Seq    Sequence
	Tokens []int // appended to Seq; at least one
	Next   int   // set by Step: argmax of the logits after the last token
}

var (
	// ErrContextFull reports a sequence that would grow past the model's
	// max_position_embeddings.
	ErrContextFull = errors.New("context longer than the model allows")
	// ErrNoCapacity reports a KV cache (or its sequence slots) used up:
	// release sequences and try again.
	ErrNoCapacity = errors.New("KV cache full")
)

// CheckBatch validates a batch against the model before any work is done:
// tokens in the vocabulary, positions within max_position_embeddings.
func CheckBatch(c *qwen3.Config, batch []*Entry) error {
	for i, e := range batch {
		if len(e.Tokens) == 0 {
			return fmt.Errorf("batch entry %d: no tokens", i)
		}
		if n := e.Seq.Len() + len(e.Tokens); n > c.MaxPositionEmbeddings {
			return fmt.Errorf("batch entry %d: %d positions: %w (max_position_embeddings %d)", i, n, ErrContextFull, c.MaxPositionEmbeddings)
		}
		for j, t := range e.Tokens {
			if t < 0 || t >= c.VocabSize {
				return fmt.Errorf("batch entry %d: token %d at index %d is outside the vocabulary [0, %d)", i, t, j, c.VocabSize)
			}
		}
	}
	return nil
}

// Chainer is an Engine that runs several greedy steps in one call, each
// entry fed its own greedy token on the device: no round trip to the host
// between steps, so the host records a step while the device runs the one
// before.
type Chainer interface {
	// StepN equals n calls of Step, each after the first with every entry's
	// tokens replaced by its Next: it returns each entry's n greedy tokens.
	// The caches then hold the entries' tokens and the first n-1 of those;
	// entry.Next is the last. Entries' Tokens are left as they were.
	StepN(ctx context.Context, batch []*Entry, n int) ([][]int, error)
}

// StepN runs n greedy steps over batch (see Chainer): through the engine's
// own StepN when it has one, else as n Steps.
func StepN(ctx context.Context, e Engine, batch []*Entry, n int) ([][]int, error) {
	if n <= 0 {
		return nil, fmt.Errorf("step n: n = %d, want > 0", n)
	}
	if c, ok := e.(Chainer); ok {
		return c.StepN(ctx, batch, n)
	}
	tokens := make([][]int, len(batch))
	for i, en := range batch {
		tokens[i] = en.Tokens
	}
	defer func() {
		for i, en := range batch {
			en.Tokens = tokens[i]
		}
	}()
	out := make([][]int, len(batch))
	for range n {
		if err := e.Step(ctx, batch); err != nil {
			return out, err
		}
		for i, en := range batch {
			out[i] = append(out[i], en.Next)
			en.Tokens = []int{en.Next}
		}
	}
	return out, nil
}

// Draft feeds tokens to seq and returns the n greedy tokens that follow; the
// cache then holds tokens and the first n-1 drafted ones.
func Draft(ctx context.Context, e Engine, seq Sequence, tokens []int, n int) ([]int, error) {
	if n <= 0 {
		return nil, fmt.Errorf("draft: n = %d, want > 0", n)
	}
	out, err := StepN(ctx, e, []*Entry{{Seq: seq, Tokens: tokens}}, n)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// KVBytesPerToken is the KV-cache memory of one position: keys and values of
// every layer, elemBytes each.
func KVBytesPerToken(c *qwen3.Config, elemBytes int) int {
	return 2 * c.NumHiddenLayers * c.KVDim() * elemBytes
}

// Warm runs a short draft on a scratch sequence, so that an engine's
// one-time work (compiling GPU pipelines, first allocations) is done before
// the first request rather than during it.
func Warm(ctx context.Context, e Engine) error {
	seq, err := e.NewSequence()
	if err != nil {
		return err
	}
	defer seq.Release()
	_, err = Draft(ctx, e, seq, []int{0, 0, 0}, 2)
	return err
}
