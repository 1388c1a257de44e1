package server

import (
	"bytes"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/gorilla/websocket"

	"webdraft/live"
	"webdraft/speculative"
	"webdraft/web"
)

// The live page (package web) and its websocket: each connection is a
// session that runs one generation at a time — speculative decoding, then
// for the race the target alone — and sends a message a verification step
// (web/README.md has the protocol). The messages a session sent are kept,
// for GET /sessions/{id}/events.

// Limits of the page.
const (
	wsWriteWait  = 10 * time.Second
	wsPongWait   = 60 * time.Second
	wsPingPeriod = wsPongWait * 9 / 10
	wsReadLimit  = 64 << 10
	// wsSendBuffer holds every message of the longest run (one a step, and
	// each step emits a token at least) and its race, so the loop never
	// waits on a slow tab; a tab that falls that far behind — or that has
	// wsSendBytes of messages not yet sent — loses its run.
	wsSendBuffer = 2*live.MaxTokens + 64
	wsSendBytes  = 4 << 20

	// edgeDraftTimeout bounds the wait for an edge run's draft from the
	// page (a draft on a CPU-rendered GPU takes seconds; a tab that never
	// answers loses its run).
	edgeDraftTimeout = time.Minute
	// edgeMaxDraftMS bounds the draft time a page reports.
	edgeMaxDraftMS = 3600e3

	keptSessions   = 64       // the most recent sessions whose events GET /sessions/{id}/events serves
	keptEvents     = 4096     // of each, the first this many messages
	keptEventBytes = 4 << 20  // and at most this many bytes of them
	keptLogBytes   = 64 << 20 // of all kept sessions; past it the oldest logs go first
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
		what := "The models are loading…"
		if s.warming.Load() {
			what = "The models are loaded and warming up…"
		}
		fmt.Fprintf(w, `<!DOCTYPE html><meta http-equiv="refresh" content="1"><title>webdraft</title><p>%s</p>`, what)
		return
	}
	d := web.PageData{Drafter: st.drafts().Name, MaxK: speculative.MaxK, MaxTokens: live.MaxTokens, Auth: s.apiKey != "",
		TopK: 1, MaxTopK: speculative.MaxTopK, DraftTokens: speculative.DefaultTreeNodes, MaxDraftTokens: speculative.MaxTreeNodes}
	if st.target != nil {
		d.Target, d.K, d.TopK, d.DraftTokens = st.target.Name, st.gen.K(), st.gen.TopK(), st.gen.TreeNodes()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := web.Page(d).Render(r.Context(), w); err != nil {
		s.log.Warn("rendering the page", "err", err)
	}
}

// wsOrigin lets a browser's websocket in from a page of this server or of
// an origin --cors-origin lists; clients without an Origin (not browsers)
// may connect.
func (s *Server) wsOrigin(r *http.Request) bool {
	return sameOrigin(r) || s.origins.allows(r.Header.Get("Origin"))
}

// sameOrigin reports whether a request has no Origin or its own host's.
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
	found := false
	for _, p := range websocket.Subprotocols(r) {
		found = s.keyMatches(p, wsProtocol+".bearer.") || found // every offer compared: no early exit
	}
	return found
}

func (s *Server) websocket(w http.ResponseWriter, r *http.Request) {
	st := s.ready.Load()
	switch {
	case st == nil:
		s.fail(w, s.unavailable())
		return
	case st.target == nil:
		s.fail(w, &apiError{http.StatusNotFound, "no_target", "this server drafts only: start it with a target for the live page"})
		return
	}
	release, refused := s.open.take(clientAddr(r), s.limits)
	if refused != "" {
		s.fail(w, &apiError{http.StatusTooManyRequests, "too_many_sessions", refused})
		return
	}
	defer release() // the session ends before the handler returns (ps.read)
	up := websocket.Upgrader{CheckOrigin: s.wsOrigin, Subprotocols: []string{wsProtocol},
		Error: func(w http.ResponseWriter, r *http.Request, status int, reason error) {
			s.fail(w, &apiError{status, statusCode(status), reason.Error()})
		}}
	conn, err := up.Upgrade(w, r, nil)
	if err != nil {
		return // Upgrade has answered the client
	}
	ps := &pageSession{id: newSessionID(), s: s, st: st, conn: conn, send: make(chan []byte, wsSendBuffer)}
	ps.run = ps.newRunner()
	ps.abort = ps.run.Abort
	s.sessions.open(ps.id)
	s.log.Info("page session", "session", ps.id, "remote", r.RemoteAddr)
	go ps.write()
	ps.emit(map[string]any{"type": "hello", "session": ps.id, "drafter": st.drafts().Name, "target": st.target.Name, "k": st.gen.K(),
		"backend": st.target.Engine.Info().Backend, "edge": true})
	ps.read()
}

func newSessionID() string { return "s-" + strings.ToLower(crand.Text()[:16]) }

// pageSession is one websocket: its reader (the handler's goroutine), its
// writer, and its runs (package live: at most one at a time — a start
// while a run goes on stops that run first).
type pageSession struct {
	id     string
	s      *Server
	st     *state
	conn   *websocket.Conn
	send   chan []byte
	queued atomic.Int64 // bytes in send
	run    *live.Runner
	abort  func() // ends the run without waiting: run.Abort

	mu     sync.Mutex
	closed bool                // send is closed: nothing more is emitted
	remote *speculative.Remote // the latest edge run's drafter: the page
}

// newRunner is the session's live view on the server's generator, its
// events sent through emit.
func (ps *pageSession) newRunner() *live.Runner {
	st := ps.st
	return &live.Runner{
		Gen: st.gen, Tokenizer: st.target.Tokenizer, Stop: st.target.Stop, MaxContext: st.maxContext(), TopN: live.TopN,
		// A GPU compiles a shape's pipelines on its first run.
		WarmRaces: st.target.Engine.Info().Backend == "webgpu",
		Emit:      func(ev map[string]any) { ps.emit(ev) },
		Done:      func(_ string, res speculative.Result) { ps.s.metrics.generated(res, "page") },
		// Both runs of a start within the generation time limit.
		Timeout:      ps.s.limits.GenerationTimeout,
		TimeoutError: &timeoutError{"the run", ps.s.limits.GenerationTimeout, "--generation-timeout"},
		// Edge drafting: the page drafts each step (draft_request, draft).
		Remote: func(head bool) *speculative.Remote {
			ask := func(a speculative.DraftAsk) {
				m := map[string]any{"type": "draft_request", "id": a.ID, "tokens": a.Tokens, "reset": a.Reset, "k": a.K}
				if a.Features != nil {
					m["features"] = a.Features
				}
				if a.Coupled != nil {
					m["coupled"] = a.Coupled // a sampled run's keys: the page drafts coupled draws
				}
				ps.emit(m)
			}
			rm := speculative.NewRemote(ask, edgeDraftTimeout)
			if head {
				rm = speculative.NewHeadRemote(ask, edgeDraftTimeout)
			}
			ps.mu.Lock()
			ps.remote = rm // the run before ends with the start (Begin): its late drafts are stale here
			ps.mu.Unlock()
			return rm
		},
	}
}

// draftMessage is the page's draft for an edge run's draft_request.
type draftMessage struct {
	Type    string  `json:"type"`
	ID      int     `json:"id"`
	Tokens  *[]int  `json:"tokens"`
	DraftMS float64 `json:"draft_ms"`
	Error   string  `json:"error"` // the page could not draft: the run ends with it
}

// draft hands the page's draft to its edge run, checked: the id asked
// for, at most k tokens, each in the vocabulary. A draft for a run that
// has ended (stopped, timed out) is dropped without a word.
func (ps *pageSession) draft(data []byte) {
	var m draftMessage
	err := decodeStrict(bytes.NewReader(data), &m, noNulls)
	ps.mu.Lock()
	rm := ps.remote
	ps.mu.Unlock()
	vocab := ps.st.target.Engine.Config().VocabSize
	if err == nil {
		switch {
		case m.Tokens == nil && m.Error == "":
			err = errors.New("a draft: tokens missing")
		case !(m.DraftMS >= 0 && m.DraftMS <= edgeMaxDraftMS):
			err = fmt.Errorf("a draft: draft_ms %v: want 0…%v", m.DraftMS, edgeMaxDraftMS)
		case rm == nil:
			err = fmt.Errorf("a draft (id %d): no edge run asked for one", m.ID)
		}
	}
	var tokens []int
	if err == nil && m.Tokens != nil {
		tokens = *m.Tokens
		for i, id := range tokens {
			if id < 0 || id >= vocab {
				err = fmt.Errorf("a draft: token %d at index %d is outside the vocabulary [0, %d)", id, i, vocab)
				break
			}
		}
	}
	if err == nil {
		a := speculative.DraftAnswer{ID: m.ID, Tokens: tokens, DraftTime: time.Duration(m.DraftMS * float64(time.Millisecond))}
		if m.Error != "" {
			a.Err = errors.New(clip(m.Error))
		}
		if err = rm.Answer(a); errors.Is(err, speculative.ErrStaleDraft) {
			return
		}
	}
	if err != nil {
		ps.emit(map[string]any{"type": "error", "message": err.Error()})
	}
}

// follow moves the session onto the state that serves now, when the
// server has recovered from an engine fault since the last run: the
// session outlives the generator it began on. It fails while no state
// serves.
func (ps *pageSession) follow() *apiError {
	st := ps.s.ready.Load()
	if st == nil || st.gen == nil {
		return ps.s.unavailable()
	}
	if st == ps.st {
		return nil
	}
	ps.run.End()
	ps.mu.Lock()
	ps.st = st
	ps.run = ps.newRunner()
	ps.abort = ps.run.Abort
	ps.mu.Unlock()
	return nil
}

// read takes the page's messages until the socket closes, then ends the
// run and the writer. Messages are decoded as strictly as the API's bodies
// (input.go): exact names, no duplicates, no nulls, no unknown fields.
func (ps *pageSession) read() {
	defer func() {
		ps.mu.Lock()
		if ps.remote != nil {
			ps.remote.Close(errors.New("the page's socket closed")) // its run ends at once
		}
		ps.mu.Unlock()
		ps.run.End()
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
		var head struct {
			Type string `json:"type"`
		}
		if jsonv2.Unmarshal(data, &head) == nil && head.Type == "draft" {
			ps.draft(data)
			continue
		}
		var m live.Start
		if err := decodeStrict(bytes.NewReader(data), &m, noNulls); err != nil {
			ps.emit(map[string]any{"type": "error", "message": err.Error()})
			continue
		}
		switch m.Type {
		case "start":
			if err := ps.follow(); err != nil {
				ps.emit(map[string]any{"type": "error", "message": err.message})
				continue
			}
			req, err := ps.run.Request(m)
			if err != nil {
				ps.emit(map[string]any{"type": "error", "message": err.Error()})
				continue
			}
			ps.run.Begin(req, m.Race)
		case "stop":
			ps.run.End()
		default:
			ps.emit(map[string]any{"type": "error", "message": fmt.Sprintf("type %s: want start, stop or draft", quote(m.Type))})
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
			ps.queued.Add(-int64(len(msg)))
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
// behind that its buffer is full (wsSendBuffer messages or wsSendBytes)
// loses its run (and the messages that did not fit).
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
	ps.s.sessions.record(ps.id, b)
	n := int64(len(b))
	if ps.queued.Add(n) <= wsSendBytes {
		select {
		case ps.send <- b:
			return
		default:
		}
	}
	ps.queued.Add(-n) // not queued
	if ps.abort != nil {
		ps.abort()
	}
}

// eventLog is what a session sent, in order: its first keptEvents
// messages, keptEventBytes at most.
type eventLog struct {
	events []json.RawMessage
	bytes  int
}

// sessionLogs keeps the event logs of the most recent sessions:
// keptSessions of them, keptLogBytes in all.
type sessionLogs struct {
	mu    sync.Mutex
	order []string // oldest first
	logs  map[string]*eventLog
	bytes int // Σ logs' bytes
}

// open starts id's log, dropping the oldest past keptSessions.
func (s *sessionLogs) open(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logs == nil {
		s.logs = map[string]*eventLog{}
	}
	s.logs[id] = &eventLog{}
	s.order = append(s.order, id)
	if len(s.order) > keptSessions {
		s.dropOldest()
	}
}

// record adds b to id's log, if the log is kept and has room; past
// keptLogBytes in all, the oldest other logs are dropped.
func (s *sessionLogs) record(id string, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.logs[id]
	if l == nil || len(l.events) >= keptEvents || l.bytes+len(b) > keptEventBytes {
		return
	}
	l.events = append(l.events, b)
	l.bytes += len(b)
	s.bytes += len(b)
	for s.bytes > keptLogBytes && s.order[0] != id {
		s.dropOldest()
	}
}

func (s *sessionLogs) dropOldest() {
	id := s.order[0]
	s.bytes -= s.logs[id].bytes
	delete(s.logs, id)
	s.order = s.order[1:]
}

// events is a copy of id's log; false when it is not kept.
func (s *sessionLogs) events(id string) ([]json.RawMessage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.logs[id]
	if l == nil {
		return nil, false
	}
	return append([]json.RawMessage{}, l.events...), true
}

// sessionSlots counts the page sessions open, in all and by client
// address, for Limits.MaxSessions and MaxSessionsPerClient.
type sessionSlots struct {
	mu       sync.Mutex
	total    int
	byClient map[string]int
}

// take opens a session for client: release closes it; refused, when not
// empty, says which bound is reached (and nothing is opened).
func (o *sessionSlots) take(client string, l Limits) (release func(), refused string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.total >= l.MaxSessions:
		return nil, fmt.Sprintf("%d page sessions are open, the most this server takes (--max-sessions); close one or retry later", l.MaxSessions)
	case o.byClient[client] >= l.MaxSessionsPerClient:
		return nil, fmt.Sprintf("%d page sessions are open from your address, the most one address may hold (--max-sessions-per-client); close a tab or retry later", l.MaxSessionsPerClient)
	}
	if o.byClient == nil {
		o.byClient = map[string]int{}
	}
	o.total++
	o.byClient[client]++
	var once sync.Once
	return func() {
		once.Do(func() {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.total--
			if o.byClient[client]--; o.byClient[client] == 0 {
				delete(o.byClient, client)
			}
		})
	}, ""
}

// count is the sessions open.
func (o *sessionSlots) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.total
}

// clientAddr is a request's client address without its port (behind a
// proxy, the proxy's).
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// sessionEvents answers GET /sessions/{id}/events: the messages a page
// session was sent, as a JSON array.
func (s *Server) sessionEvents(w http.ResponseWriter, r *http.Request) {
	events, ok := s.sessions.events(r.PathValue("id"))
	if !ok {
		s.fail(w, &apiError{http.StatusNotFound, "no_session", fmt.Sprintf("no such session (the last %d are kept, %d MiB of events in all)", keptSessions, keptLogBytes>>20)})
		return
	}
	writeJSON(w, http.StatusOK, events)
}
