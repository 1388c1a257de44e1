package server

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"webdraft/sampling"
	"webdraft/speculative"
	"webdraft/tokenizer"
	"webdraft/web"
)

// The live page (package web) and its websocket: each connection is a
// session that runs one generation at a time — speculative decoding, then
// for the race the target alone — and sends a message a verification step
// (web/README.md has the protocol). The messages a session sent are kept,
// for GET /sessions/{id}/events.

// Limits of the page.
const (
	pageMaxTokens = 512 // a page run's longest output
	pageTopN      = 5   // the alternatives shown for each token

	wsWriteWait  = 10 * time.Second
	wsPongWait   = 60 * time.Second
	wsPingPeriod = wsPongWait * 9 / 10
	wsReadLimit  = 64 << 10
	// wsSendBuffer holds every message of the longest run (one a step, and
	// each step emits a token at least) and its race, so the loop never
	// waits on a slow tab; a tab that falls that far behind loses its run.
	wsSendBuffer = 2*pageMaxTokens + 64

	keptSessions = 64   // the most recent sessions whose events GET /sessions/{id}/events serves
	keptEvents   = 4096 // of each, the first this many messages
)

// wsProtocol is the websocket subprotocol the page speaks; with an API
// key it also offers "webdraft.bearer.KEY", as browsers cannot set an
// Authorization header on a websocket.
const wsProtocol = "webdraft"

func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	st := s.ready.Load()
	if st == nil {
		w.Header().Set("Retry-After", retryAfter)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `<!DOCTYPE html><meta http-equiv="refresh" content="1"><title>webdraft</title><p>The models are loading…</p>`)
		return
	}
	d := web.PageData{Drafter: st.drafter.Name, MaxK: speculative.MaxK, MaxTokens: pageMaxTokens, Auth: s.apiKey != ""}
	if st.target != nil {
		d.Target, d.K = st.target.Name, st.gen.K()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := web.Page(d).Render(r.Context(), w); err != nil {
		s.log.Warn("rendering the page", "err", err)
	}
}

// sameOrigin lets a browser's websocket in only from a page of this
// server; clients without an Origin (not browsers) may connect.
func sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}

// wsKey reports whether a websocket request offers the API key as a
// subprotocol.
func (s *Server) wsKey(r *http.Request) bool {
	want := []byte(wsProtocol + ".bearer." + s.apiKey)
	for _, p := range websocket.Subprotocols(r) {
		if subtle.ConstantTimeCompare([]byte(p), want) == 1 {
			return true
		}
	}
	return false
}

func (s *Server) websocket(w http.ResponseWriter, r *http.Request) {
	st := s.ready.Load()
	switch {
	case st == nil:
		s.fail(w, &apiError{http.StatusServiceUnavailable, "loading", "the models are still loading"})
		return
	case st.target == nil:
		s.fail(w, &apiError{http.StatusNotFound, "no_target", "this server drafts only: start it with a target for the live page"})
		return
	}
	up := websocket.Upgrader{CheckOrigin: sameOrigin, Subprotocols: []string{wsProtocol},
		Error: func(w http.ResponseWriter, r *http.Request, status int, reason error) {
			s.fail(w, &apiError{status, statusCode(status), reason.Error()})
		}}
	conn, err := up.Upgrade(w, r, nil)
	if err != nil {
		return // Upgrade has answered the client
	}
	ps := &pageSession{
		id: newSessionID(), s: s, st: st, conn: conn,
		send: make(chan []byte, wsSendBuffer), log: &eventLog{},
	}
	s.sessions.add(ps.id, ps.log)
	s.log.Info("page session", "session", ps.id, "remote", r.RemoteAddr)
	go ps.write()
	ps.emit(map[string]any{"type": "hello", "session": ps.id, "drafter": st.drafter.Name, "target": st.target.Name, "k": st.gen.K(),
		"backend": st.target.Engine.Info().Backend})
	ps.read()
}

func newSessionID() string { return "s-" + strings.ToLower(crand.Text()[:16]) }

// pageSession is one websocket: its reader (the handler's goroutine), its
// writer, and at most one run at a time.
type pageSession struct {
	id   string
	s    *Server
	st   *state
	conn *websocket.Conn
	send chan []byte
	log  *eventLog

	mu     sync.Mutex
	cancel context.CancelFunc // the current run's; nil when none
	ran    chan struct{}      // closed when the current run has ended
	closed bool               // send is closed: nothing more is emitted
}

// startMessage is the page's request for a run, decoded as strictly as
// the API's bodies (input.go): exact names, no duplicates, no nulls, no
// unknown fields.
type startMessage struct {
	Type        string  `json:"type"`
	Prompt      string  `json:"prompt"`
	Chat        bool    `json:"chat"`
	K           int     `json:"k"`
	MaxTokens   int     `json:"max_tokens"`
	Temperature float64 `json:"temperature"`
	TopP        float64 `json:"top_p"`
	Seed        uint64  `json:"seed"`
	Race        bool    `json:"race"`
}

// read takes the page's messages until the socket closes, then ends the
// run and the writer.
func (ps *pageSession) read() {
	defer func() {
		ps.stop()
		ps.mu.Lock()
		ps.closed = true
		close(ps.send)
		ps.mu.Unlock()
		ps.s.log.Info("page session closed", "session", ps.id)
	}()
	ps.conn.SetReadLimit(wsReadLimit)
	_ = ps.conn.SetReadDeadline(time.Now().Add(wsPongWait)) // an error here shows at the next read
	ps.conn.SetPongHandler(func(string) error { return ps.conn.SetReadDeadline(time.Now().Add(wsPongWait)) })
	for {
		_, data, err := ps.conn.ReadMessage()
		if err != nil {
			return
		}
		var m startMessage
		if err := decodeStrict(bytes.NewReader(data), &m, noNulls); err != nil {
			ps.emit(map[string]any{"type": "error", "message": err.Error()})
			continue
		}
		switch m.Type {
		case "start":
			req, err := ps.request(m)
			if err != nil {
				ps.emit(map[string]any{"type": "error", "message": err.Error()})
				continue
			}
			ps.stop()
			ps.begin(req, m.Race)
		case "stop":
			ps.stop()
		default:
			ps.emit(map[string]any{"type": "error", "message": fmt.Sprintf("type %s: want start or stop", quote(m.Type))})
		}
	}
}

// write sends what is emitted, and pings, until send is closed.
func (ps *pageSession) write() {
	ping := time.NewTicker(wsPingPeriod)
	defer func() {
		ping.Stop()
		ps.conn.Close()
	}()
	for {
		select {
		case msg, ok := <-ps.send:
			_ = ps.conn.SetWriteDeadline(time.Now().Add(wsWriteWait)) // a past deadline fails the write below
			if !ok {
				_ = ps.conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")) // the peer may be gone already
				return
			}
			if err := ps.conn.WriteMessage(websocket.TextMessage, msg); err != nil {
				return // the reader sees the connection fail and ends the session
			}
		case <-ping.C:
			_ = ps.conn.SetWriteDeadline(time.Now().Add(wsWriteWait)) // a past deadline fails the write below
			if err := ps.conn.WriteMessage(websocket.PingMessage, nil); err != nil {
				return
			}
		}
	}
}

// emit queues a message without waiting, and records it. A tab so far
// behind that its buffer is full loses its run (and the messages that did
// not fit).
func (ps *pageSession) emit(msg any) {
	b, err := json.Marshal(msg)
	if err != nil {
		ps.s.log.Error("page message", "err", err)
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return
	}
	ps.log.add(b)
	select {
	case ps.send <- b:
	default:
		if ps.cancel != nil {
			ps.cancel()
		}
	}
}

// request checks a start message and makes it a generation request.
func (ps *pageSession) request(m startMessage) (speculative.Request, error) {
	st := ps.st
	tok := st.target.Tokenizer
	switch {
	case tok == nil:
		return speculative.Request{}, errors.New("the target has no tokenizer: the page takes text")
	case strings.TrimSpace(m.Prompt) == "":
		return speculative.Request{}, errors.New("the prompt is empty")
	case m.K < 1 || m.K > speculative.MaxK:
		return speculative.Request{}, fmt.Errorf("k %d: want 1…%d", m.K, speculative.MaxK)
	case m.MaxTokens < 1 || m.MaxTokens > pageMaxTokens:
		return speculative.Request{}, fmt.Errorf("max tokens %d: want 1…%d", m.MaxTokens, pageMaxTokens)
	case !(m.Temperature >= 0 && m.Temperature <= 2):
		return speculative.Request{}, fmt.Errorf("temperature %v: want 0…2", m.Temperature)
	case m.TopP != 0 && !(m.TopP > 0 && m.TopP <= 1):
		return speculative.Request{}, fmt.Errorf("top_p %v: want a value in (0, 1]", m.TopP)
	}
	text := m.Prompt
	if m.Chat {
		var err error
		if text, err = tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: m.Prompt}}, true, true); err != nil {
			return speculative.Request{}, err
		}
	}
	prompt := tok.Encode(text)
	if room := st.maxContext() - len(prompt); room < m.MaxTokens {
		return speculative.Request{}, fmt.Errorf("a prompt of %d tokens leaves %d of the context's %d for the output, not %d", len(prompt), max(room, 0), st.maxContext(), m.MaxTokens)
	}
	req := speculative.Request{
		Prompt: prompt, MaxTokens: m.MaxTokens, K: m.K, Seed: m.Seed, TopN: pageTopN, DraftTopN: pageTopN,
		Sampling: sampling.Params{Temperature: float32(m.Temperature), TopP: float32(m.TopP)}, Stop: st.target.Stop, Fresh: true,
	}
	return req, st.gen.Check(req)
}

// begin starts a run: speculative decoding, then with race the target
// alone on the same prompt, one after the other so neither slows the
// other, both from a cold prompt.
func (ps *pageSession) begin(req speculative.Request, race bool) {
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	ps.mu.Lock()
	ps.cancel, ps.ran = cancel, ran
	ps.mu.Unlock()
	go func() {
		defer close(ran)
		defer cancel()
		spec, ok := ps.generate(ctx, "speculative", req)
		if !ok {
			return
		}
		if race {
			alone := req
			alone.K, alone.DraftTopN = speculative.NoDraft, 0
			base, ok := ps.generate(ctx, "target", alone)
			if !ok {
				return
			}
			ps.emit(map[string]any{"type": "race", "speculative_tokens_per_s": spec, "target_tokens_per_s": base, "speedup": spec / base})
		}
		ps.emit(map[string]any{"type": "finished"})
	}()
}

// stop ends the current run, if any, and waits until its sequences are
// back with the loop.
func (ps *pageSession) stop() {
	ps.mu.Lock()
	cancel, ran := ps.cancel, ps.ran
	ps.cancel, ps.ran = nil, nil
	ps.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-ran
}

// generate runs one generation, sending its steps; it returns its
// tokens/s and whether it finished.
func (ps *pageSession) generate(ctx context.Context, run string, req speculative.Request) (float64, bool) {
	tok := ps.st.target.Tokenizer
	dec := tok.NewStreamDecoder()
	steps := 0
	req.OnStep = func(s speculative.Step) bool {
		steps++
		ps.emit(stepMessage(run, steps, s, tok, dec))
		return true
	}
	ps.emit(map[string]any{"type": "start", "run": run, "prompt_tokens": len(req.Prompt), "k": max(req.K, 0)})
	start := time.Now()
	res, err := ps.st.gen.Submit(ctx, req)
	secs := time.Since(start).Seconds()
	switch {
	case errors.Is(err, context.Canceled):
		ps.emit(map[string]any{"type": "stopped", "run": run})
		return 0, false
	case err != nil:
		ps.emit(map[string]any{"type": "error", "message": err.Error()})
		return 0, false
	}
	ps.s.metrics.generated(res, "page")
	tps := float64(len(res.Tokens)) / secs
	ps.emit(map[string]any{
		"type": "done", "run": run, "tokens": len(res.Tokens), "steps": res.Stats.Steps, "seconds": round3(secs),
		"tokens_per_s": round3(tps), "tau": round3(res.Stats.Tau()), "drafted": res.Stats.Drafted,
		"accepted": res.Stats.Accepted, "finish": res.Finish,
	})
	return tps, true
}

// pageToken is a token as the page shows it.
type pageToken struct {
	ID      int          `json:"id"`
	Text    string       `json:"text"`
	P       float64      `json:"p"` // its probability (the softmax at temperature 1)
	Drafted bool         `json:"drafted,omitempty"`
	Top     []pageChoice `json:"top"`
}

type pageChoice struct {
	ID   int     `json:"id"`
	Text string  `json:"text"`
	P    float64 `json:"p"`
}

// stepMessage is a step as the page gets it: the draft with the
// drafter's alternatives, how much of it was accepted, the tokens emitted
// (their text through dec, so that it adds up to the output) with the
// target's alternatives, and the step's times.
func stepMessage(run string, n int, s speculative.Step, tok *tokenizer.Tokenizer, dec *tokenizer.StreamDecoder) map[string]any {
	one := func(id int) string {
		t, err := tok.Decode([]int{id})
		if err != nil {
			return fmt.Sprintf("<%d>", id)
		}
		return t
	}
	choices := func(top []sampling.TokenLogprob) []pageChoice {
		out := make([]pageChoice, len(top))
		for i, c := range top {
			out[i] = pageChoice{ID: c.Token, Text: one(c.Token), P: prob(c.Logprob)}
		}
		return out
	}
	draft := make([]pageToken, len(s.Draft))
	for i, d := range s.Draft {
		draft[i] = pageToken{ID: d.ID, Text: one(d.ID), P: prob(d.Logprob), Top: choices(d.Top)}
	}
	tokens := make([]pageToken, len(s.Tokens))
	for i, t := range s.Tokens {
		text, err := dec.Next(t.ID)
		if err != nil {
			text = fmt.Sprintf("<%d>", t.ID)
		}
		tokens[i] = pageToken{ID: t.ID, Text: text, P: prob(t.Logprob), Drafted: t.Drafted, Top: choices(t.Top)}
	}
	return map[string]any{
		"type": "step", "run": run, "step": n, "draft": draft, "accepted": s.Accepted, "tokens": tokens,
		"draft_ms": round3(ms(s.DraftTime)), "verify_ms": round3(ms(s.VerifyTime)),
	}
}

func prob(logprob float32) float64 { return round3(math.Exp(float64(logprob))) }

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// eventLog is what a session sent, in order.
type eventLog struct {
	mu     sync.Mutex
	events []json.RawMessage
}

func (l *eventLog) add(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.events) < keptEvents {
		l.events = append(l.events, b)
	}
}

func (l *eventLog) all() []json.RawMessage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]json.RawMessage{}, l.events...)
}

// sessionLogs keeps the event logs of the most recent sessions.
type sessionLogs struct {
	mu    sync.Mutex
	order []string
	logs  map[string]*eventLog
}

func (s *sessionLogs) add(id string, l *eventLog) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logs == nil {
		s.logs = map[string]*eventLog{}
	}
	s.logs[id] = l
	s.order = append(s.order, id)
	if len(s.order) > keptSessions {
		delete(s.logs, s.order[0])
		s.order = s.order[1:]
	}
}

func (s *sessionLogs) get(id string) *eventLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs[id]
}

// sessionEvents answers GET /sessions/{id}/events: the messages a page
// session was sent, as a JSON array.
func (s *Server) sessionEvents(w http.ResponseWriter, r *http.Request) {
	l := s.sessions.get(r.PathValue("id"))
	if l == nil {
		s.fail(w, &apiError{http.StatusNotFound, "no_session", "no such session (the last 64 are kept)"})
		return
	}
	writeJSON(w, http.StatusOK, l.all())
}
