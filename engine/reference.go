package engine

import (
	"context"
	"fmt"
	"runtime"

	"webdraft/qwen3"
	"webdraft/reference"
	"webdraft/sampling"
)

// Reference is the engine over the plain-Go reference model (--backend
// reference): the oracle's own arithmetic, slow and plain. The fast CPU
// engine is package engine/cpu.
type Reference struct {
	model   *reference.Model
	kvBytes int64
}

var _ Engine = (*Reference)(nil)

// NewReference returns the reference engine for a loaded weight tree, with kvBytes of
// memory for KV caches (the scheduler keeps within it).
func NewReference(cfg qwen3.Config, w *qwen3.Weights, kvBytes int64) (*Reference, error) {
	if err := CheckHead(&cfg, w); err != nil {
		return nil, err
	}
	m, err := reference.New(cfg, w)
	if err != nil {
		return nil, err
	}
	return &Reference{model: m, kvBytes: kvBytes}, nil
}

func (c *Reference) Config() qwen3.Config { return c.model.Config() }

func (c *Reference) Info() Info {
	return Info{Backend: "reference", Adapter: fmt.Sprintf("Go reference engine, %d threads", runtime.GOMAXPROCS(0))}
}

func (c *Reference) NewSequence() (Sequence, error) { return &cpuSequence{c.model.NewSequence()}, nil }

// KVCapacity: the budget over f32 keys and values of every layer.
func (c *Reference) KVCapacity() int {
	cfg := c.model.Config()
	return int(c.kvBytes / int64(KVBytesPerToken(&cfg, 4)))
}

// Step runs the whole batch as one reference forward pass: every matrix is
// read once for all the batch's tokens.
func (c *Reference) Step(ctx context.Context, batch []*Entry) error {
	cfg := c.model.Config()
	if err := CheckBatch(&cfg, batch); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	inputs := make([]reference.Input, len(batch))
	for i, e := range batch {
		seq, ok := e.Seq.(*cpuSequence)
		if !ok {
			return fmt.Errorf("reference engine: sequence of another engine (%T)", e.Seq)
		}
		inputs[i] = reference.Input{Seq: seq.Sequence, Tokens: e.Tokens, Parents: e.Parents}
	}
	logits, err := c.model.ForwardBatch(inputs)
	if err != nil {
		return err
	}
	for i, e := range batch {
		row, err := sampling.Choose(logits[i], sampling.Params{}, sampling.Draw{X: sampling.NoProposal})
		if err != nil {
			return fmt.Errorf("reference engine: batch entry %d: %w", i, err)
		}
		e.Next, e.Logprob, e.Top = row.Argmax, row.ArgmaxLogprob, nil
		if e.TopN > 0 {
			e.Top = sampling.Top(logits[i], e.TopN, row.LogSumExp)
		}
	}
	return nil
}

// Verify runs the batch as one reference forward pass and reads out each
// entry's last Out rows through package sampling, as the GPU does.
func (c *Reference) Verify(ctx context.Context, batch []*VerifyEntry) error {
	cfg := c.model.Config()
	if err := CheckVerify(&cfg, batch); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	inputs := make([]reference.Input, len(batch))
	outs := make([]int, len(batch))
	for i, e := range batch {
		seq, ok := e.Seq.(*cpuSequence)
		if !ok {
			return fmt.Errorf("reference engine: sequence of another engine (%T)", e.Seq)
		}
		inputs[i] = reference.Input{Seq: seq.Sequence, Tokens: e.Tokens, Parents: e.Parents}
		outs[i] = e.Out
	}
	rows, err := c.model.ForwardRows(inputs, outs)
	if err != nil {
		return err
	}
	var hs HostSampler
	for i, e := range batch {
		e.Rows = make([]VerifyRow, e.Out)
		for j, logits := range rows[i] {
			d, params := sampling.Draw{X: sampling.NoProposal}, e.Sampling
			switch {
			case e.Propose != nil || e.Tree != nil:
				params = sampling.Params{} // the rows' greedy read-out; hs draws
			case !e.Sampling.Greedy():
				d = e.Draws[j]
			}
			row, err := sampling.Choose(logits, params, d)
			if err != nil {
				return fmt.Errorf("reference engine: batch entry %d row %d: %w", i, j, err)
			}
			e.Rows[j].Row = row
			if e.TopN > 0 {
				e.Rows[j].Top = sampling.Top(logits, e.TopN, row.LogSumExp)
			}
		}
		if err := hs.Read(e, func(j int) []float32 { return rows[i][j] }); err != nil {
			return fmt.Errorf("reference engine: batch entry %d: %w", i, err)
		}
	}
	return nil
}

// SamplesDrafts: the reference engine reads out sampled drafts
// (engine.SamplesDrafts).
func (c *Reference) SamplesDrafts() bool { return true }

// DraftsCoupled: the reference engine drafts coupled draws a pass at a
// time, a coupled row's Sample (engine.DraftsCoupled).
func (c *Reference) DraftsCoupled() bool { return true }

func (c *Reference) Close() error { return nil }

type cpuSequence struct{ *reference.Sequence }

func (s *cpuSequence) Release() { s.Sequence = nil }
