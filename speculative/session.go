package speculative

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"webdraft/engine"
	"webdraft/sampling"
)

// Session is the remote's side of edge drafting (Remote): a drafter
// answering one generation's asks in turn, on the machine that drafts (the
// page's worker). The drafter is a model, or an EAGLE-3 head whose target
// engine holds the features the asks bring (engine.FeatureWriter) rather
// than computing them: the target runs where the Remote is. Between asks
// the session keeps its sequences: the drafter's cache keeps the longest
// prefix of what it fed that the new context shares (the draft tokens the
// target accepted) and feeds the rest; a head's target sequence takes
// each ask's features in place of what it held from their first position
// on. A Session is used by one goroutine at a time.
type Session struct {
	drafter engine.Engine
	target  featureTarget   // a head's target; nil for a drafter that reads text alone
	seq     engine.Sequence // the drafter's
	tseq    engine.Sequence // the head's target's: features only
	held    []int           // the tokens in seq's cache
	context []int
}

// featureTarget is a head's target engine that takes features computed
// elsewhere.
type featureTarget interface {
	engine.Engine
	engine.FeatureWriter
}

// NewSession is a session of drafter. A head's target engine
// (engine.ReadsTarget) must take features (engine.FeatureWriter).
func NewSession(drafter engine.Engine) (*Session, error) {
	s := &Session{drafter: drafter}
	if t := engine.ReadsTarget(drafter); t != nil {
		w, ok := t.(featureTarget)
		if !ok || w.FeatureWidth() == 0 {
			return nil, errors.New("edge session: the head's target engine takes no features from elsewhere")
		}
		s.target = w
	}
	return s, nil
}

// ReadsFeatures reports whether the session drafts with an EAGLE-3 head:
// its asks must carry the target's features (NewHeadRemote).
func (s *Session) ReadsFeatures() bool { return s.target != nil }

// Draft answers ask a: up to a.K tokens after the context (a.Tokens on top
// of the asks before, or the whole context with a.Reset) — the drafter's
// greedy tokens, or its coupled draws where a.Coupled asks for them
// (engine.SampleN). A head
// drafts nothing while its target's features do not reach the context's
// last token but one (nor for a context of one token). A failed draft leaves the session empty: the next
// ask must reset it.
func (s *Session) Draft(ctx context.Context, a DraftAsk) ([]int, error) {
	c := s.drafter.Config()
	switch {
	case a.K < 1 || a.K > MaxK:
		return nil, fmt.Errorf("edge session: k %d: want 1…%d", a.K, MaxK)
	case !a.Reset && s.seq == nil:
		return nil, errors.New("edge session: the first ask of a session must reset it (the whole context)")
	case s.target != nil && a.Features == nil:
		return nil, errors.New("edge session: an EAGLE-3 head drafts over the target's features, and the ask brings none")
	case s.target == nil && a.Features != nil:
		return nil, errors.New("edge session: features for a drafter that reads text alone")
	case a.Coupled != nil && !engine.DraftsCoupled(s.drafter):
		return nil, errors.New("edge session: coupled draws asked of a drafter that does not draft them")
	}
	if a.Coupled != nil {
		if err := a.Coupled.Sampling.Validate(); err != nil {
			return nil, fmt.Errorf("edge session: coupled draws: %w", err)
		}
	}
	for i, t := range a.Tokens {
		if t < 0 || t >= c.VocabSize {
			return nil, fmt.Errorf("edge session: token %d at index %d is outside the vocabulary [0, %d)", t, i, c.VocabSize)
		}
	}
	if a.Reset {
		s.release()
	}
	all := append(s.context[:len(s.context):len(s.context)], a.Tokens...)
	switch {
	case len(all) == 0:
		return nil, errors.New("edge session: an empty context")
	case len(all)+a.K > c.MaxPositionEmbeddings:
		return nil, fmt.Errorf("edge session: a context of %d tokens and %d more exceed the model's %d positions", len(all), a.K, c.MaxPositionEmbeddings)
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	if s.target != nil {
		if err := s.takeFeatures(a.Features, len(all)); err != nil {
			return nil, err
		}
		if n := s.tseq.Len(); n == 0 || n < len(all)-1 {
			s.context = all
			s.held = s.held[:min(len(s.held), s.seq.Len())]
			return []int{}, nil
		}
	}
	keep := 0
	for keep < min(len(s.held), len(all)-1) && s.held[keep] == all[keep] {
		keep++
	}
	s.seq.Truncate(keep) // a head keeps no row past its target's features: Len may be below keep
	var out [][]engine.Token
	var err error
	if c := a.Coupled; c != nil && !c.Sampling.Greedy() {
		draws := make([]sampling.Draw, a.K)
		for i := range draws {
			draws[i] = c.Keys.At(len(all) + i)
		}
		out, err = engine.SampleN(ctx, s.drafter, []*engine.VerifyEntry{{Seq: s.seq, Target: s.tseq, Tokens: all[s.seq.Len():], Out: 1, Sampling: c.Sampling, Draws: draws}}, a.K)
	} else {
		out, err = engine.StepN(ctx, s.drafter, []*engine.Entry{{Seq: s.seq, Target: s.tseq, Tokens: all[s.seq.Len():]}}, a.K)
	}
	if err != nil {
		s.release() // the caches may hold anything: the next ask starts over
		return nil, fmt.Errorf("edge session: %w", err)
	}
	ids := engine.IDs(out[0])
	s.context = all
	s.held = append(append(make([]int, 0, len(all)+len(ids)), all...), ids...)[:s.seq.Len()]
	return ids, nil
}

// Warm drafts once over a context of 16 zeros (a head over zero
// features), so that the engines' one-time work — compiling GPU pipelines
// — is done before the first ask; the session is then empty.
func (s *Session) Warm(ctx context.Context) error {
	const n = 16
	a := DraftAsk{Tokens: make([]int, n), Reset: true, K: 4}
	if s.target != nil {
		a.Features = &FeatureRows{Width: s.target.FeatureWidth(), Rows: make([]float32, (n-1)*s.target.FeatureWidth())}
	}
	_, err := s.Draft(ctx, a)
	s.release()
	return err
}

// takeFeatures puts f's rows into the head's target sequence from their
// first position on, for a context of n tokens.
func (s *Session) takeFeatures(f *FeatureRows, n int) error {
	w := s.target.FeatureWidth()
	switch {
	case f.Width != w:
		return fmt.Errorf("edge session: features %d wide, the head reads %d a position", f.Width, w)
	case len(f.Rows)%w != 0:
		return fmt.Errorf("edge session: %d feature values: want rows of %d", len(f.Rows), w)
	case f.From < 0 || f.From > s.tseq.Len():
		return fmt.Errorf("edge session: features from position %d: the session holds %d", f.From, s.tseq.Len())
	case f.From+len(f.Rows)/w > n-1:
		return fmt.Errorf("edge session: features up to position %d for a context of %d tokens: want them only up to its last token but one", f.From+len(f.Rows)/w-1, n)
	}
	s.tseq.Truncate(f.From)
	if err := s.target.AppendFeatures(s.tseq, f.Rows); err != nil {
		s.release()
		return fmt.Errorf("edge session: %w", err)
	}
	return nil
}

// open makes the session's sequences where it has none.
func (s *Session) open() error {
	if s.seq == nil {
		seq, err := s.drafter.NewSequence()
		if err != nil {
			return fmt.Errorf("edge session: %w", err)
		}
		s.seq, s.held = seq, nil
	}
	if s.target != nil && s.tseq == nil {
		tseq, err := s.target.NewSequence()
		if err != nil {
			s.release()
			return fmt.Errorf("edge session: the head's target: %w", err)
		}
		s.tseq = tseq
	}
	return nil
}

// Close frees the session's sequences; a later ask must reset it.
func (s *Session) Close() { s.release() }

func (s *Session) release() {
	if s.seq != nil {
		s.seq.Release()
	}
	if s.tseq != nil {
		s.tseq.Release()
	}
	s.seq, s.tseq, s.held, s.context = nil, nil, nil, nil
}

// featureJSON is FeatureRows on the wire (the page's draft_request): the
// rows as little-endian f32, base64.
type featureJSON struct {
	From  int    `json:"from"`
	Width int    `json:"width"`
	Rows  string `json:"rows"`
}

// MarshalJSON writes the rows as base64 of their little-endian f32 bytes:
// exact, and a third of JSON numbers' size.
func (f FeatureRows) MarshalJSON() ([]byte, error) {
	raw := make([]byte, 4*len(f.Rows))
	for i, v := range f.Rows {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	return json.Marshal(featureJSON{From: f.From, Width: f.Width, Rows: base64.StdEncoding.EncodeToString(raw)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (f *FeatureRows) UnmarshalJSON(b []byte) error {
	var j featureJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	raw, err := base64.StdEncoding.DecodeString(j.Rows)
	if err != nil {
		return fmt.Errorf("features: rows: %w", err)
	}
	if len(raw)%4 != 0 {
		return fmt.Errorf("features: %d bytes of rows: want whole f32 values", len(raw))
	}
	rows := make([]float32, len(raw)/4)
	for i := range rows {
		rows[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	*f = FeatureRows{From: j.From, Width: j.Width, Rows: rows}
	return nil
}

// couplingJSON is Coupling on the wire (the page's draft_request): the
// keys' two words, the temperature and top_p.
type couplingJSON struct {
	Keys        *[2]uint32 `json:"keys"`
	Temperature float32    `json:"temperature"`
	TopP        float32    `json:"top_p"`
}

// MarshalJSON writes {"keys": [s0, s1], "temperature": T, "top_p": P}.
func (c Coupling) MarshalJSON() ([]byte, error) {
	return json.Marshal(couplingJSON{Keys: &[2]uint32{c.Keys.S0, c.Keys.S1}, Temperature: c.Sampling.Temperature, TopP: c.Sampling.TopP})
}

// UnmarshalJSON reads what MarshalJSON writes: the keys present, the
// sampling valid and at a temperature.
func (c *Coupling) UnmarshalJSON(b []byte) error {
	var j couplingJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	p := sampling.Params{Temperature: j.Temperature, TopP: j.TopP}
	switch err := p.Validate(); {
	case j.Keys == nil:
		return errors.New("coupled draws without keys")
	case err != nil:
		return fmt.Errorf("coupled draws: %w", err)
	case p.Greedy():
		return fmt.Errorf("coupled draws at temperature %v: want above 0", p.Temperature)
	}
	*c = Coupling{Keys: sampling.Keys{S0: j.Keys[0], S1: j.Keys[1]}, Sampling: p}
	return nil
}
