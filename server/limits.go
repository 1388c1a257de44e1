package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"time"
)

// Bounded everything (docs/reference.md, "Limits and CORS"). Every way a client can
// hold the server — a connection, its headers, its body, its time between
// requests, a slow read of the answer, a queued request, a generation, a
// page session — has a bound, and a client past one is told which.

// Limits bound what clients may hold; a zero field takes its default.
type Limits struct {
	// HeaderTimeout bounds reading a request's headers (default 10 s).
	HeaderTimeout time.Duration
	// BodyTimeout bounds reading a request's body, from the end of its
	// headers (default 30 s). A client still sending then gets 408 and its
	// connection is closed. It is a read deadline of the request's own,
	// lifted once the body is read: a long answer (an SSE stream, a
	// websocket) is not cut.
	BodyTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no new request
	// for this long (default 2 min).
	IdleTimeout time.Duration
	// WriteTimeout bounds one write of an answer — a JSON body, an SSE
	// event — to a client that does not read (default 30 s); the
	// connection is then closed.
	WriteTimeout time.Duration
	// MaxConnections bounds the open connections (default 1024); past it
	// spareConnections more are served GET /health only, and any more are
	// refused at once (connections.go).
	MaxConnections int
	// RequestTimeout bounds a POST /draft or /completion from the end of
	// its headers to its answer, body, tokenizing and queue included
	// (default 1 min): past it, 504.
	RequestTimeout time.Duration
	// GenerationTimeout bounds a generation of the OpenAI-compatible API
	// the same way, and a page run from its start message (default 10
	// min): past it the generation ends with a 504 error (after the
	// stream's tokens so far, when streaming; an error message on the
	// page's websocket).
	GenerationTimeout time.Duration
	// MaxSessions bounds the live page's sessions (websockets) open at once
	// (default 64), MaxSessionsPerClient those from one client address
	// (default 4); past either the websocket is refused with 429.
	MaxSessions, MaxSessionsPerClient int
}

// DefaultLimits are the limits a zero Limits takes.
var DefaultLimits = Limits{
	HeaderTimeout:        10 * time.Second,
	BodyTimeout:          30 * time.Second,
	IdleTimeout:          2 * time.Minute,
	WriteTimeout:         30 * time.Second,
	MaxConnections:       1024,
	RequestTimeout:       time.Minute,
	GenerationTimeout:    10 * time.Minute,
	MaxSessions:          64,
	MaxSessionsPerClient: 4,
}

// withDefaults fills l's zero fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	dur := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	num := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	dur(&l.HeaderTimeout, d.HeaderTimeout)
	dur(&l.BodyTimeout, d.BodyTimeout)
	dur(&l.IdleTimeout, d.IdleTimeout)
	dur(&l.WriteTimeout, d.WriteTimeout)
	num(&l.MaxConnections, d.MaxConnections)
	dur(&l.RequestTimeout, d.RequestTimeout)
	dur(&l.GenerationTimeout, d.GenerationTimeout)
	num(&l.MaxSessions, d.MaxSessions)
	num(&l.MaxSessionsPerClient, d.MaxSessionsPerClient)
	return l
}

// HTTPServer is an http.Server for s's Handler with s's timeouts: headers
// within HeaderTimeout, keep-alive connections closed after IdleTimeout.
// The body timeout and the write timeout are set per request by the
// handler, so that streams are not cut; there is no ReadTimeout or
// WriteTimeout for the whole connection. Serve it on s.Listener(ln), which
// caps the connections; http.Server's own error log goes to s's logger.
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: s.limits.HeaderTimeout,
		IdleTimeout:       s.limits.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext:       connContext,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// maxHeaderBytes bounds a request's headers (net/http's default is 1 MiB).
const maxHeaderBytes = 64 << 10

// bodyDeadline gives a request with a body a read deadline of
// BodyTimeout, lifted once the body has been read to its end. A body that
// does not arrive in time fails its reads with a *bodyTimeoutError; the
// deadline stays, so that nothing more is read from that connection, and
// the answer closes it.
func (s *Server) bodyDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(s.limits.BodyTimeout)); err != nil {
			// Not a connection of net/http's own (a test's recorder): the
			// body is bounded by its size alone.
			s.log.Debug("no body deadline", "err", err)
			next.ServeHTTP(w, r)
			return
		}
		// A shallow copy: net/http still sees its own body in the request
		// it keeps, which it reads to decide how to end the connection.
		wrapped := r.WithContext(r.Context())
		wrapped.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, limit: s.limits.BodyTimeout, log: s.log}
		next.ServeHTTP(w, wrapped)
	})
}

// deadlineBody is a request body under a read deadline: at its end it
// lifts the deadline, and a read past the deadline fails with a
// *bodyTimeoutError.
type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	limit  time.Duration
	log    *slog.Logger
	lifted bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var ne net.Error
	switch {
	case err == io.EOF && !b.lifted:
		b.lifted = true
		if derr := b.rc.SetReadDeadline(time.Time{}); derr != nil {
			b.log.Debug("lifting the body deadline", "err", derr)
		}
	case errors.As(err, &ne) && ne.Timeout():
		err = &bodyTimeoutError{limit: b.limit, err: err}
	}
	return n, err
}

// bodyTimeoutError is a body that did not arrive within the body timeout.
type bodyTimeoutError struct {
	limit time.Duration
	err   error
}

func (e *bodyTimeoutError) Error() string {
	return fmt.Sprintf("not received within %v (--body-timeout)", e.limit)
}

func (e *bodyTimeoutError) Unwrap() error { return e.err }

// writeDeadline bounds each write of an answer by WriteTimeout: the
// deadline is set when the request starts (replacing one an earlier
// request on the connection left), moved on before each Write and Flush,
// and once more when the handler returns, for net/http's last flush. A
// client that does not read its answer so has its connection closed
// WriteTimeout after the write that found it full; a slow one that keeps
// reading is never cut.
func (s *Server) writeDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), s: s}
		dw.extend()
		next.ServeHTTP(dw, r)
		dw.extend()
	})
}

// deadlineWriter moves the write deadline on before each write.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	s  *Server
}

func (d *deadlineWriter) extend() {
	err := d.rc.SetWriteDeadline(time.Now().Add(d.s.limits.WriteTimeout))
	if err != nil && !errors.Is(err, http.ErrNotSupported) && !errors.Is(err, http.ErrHijacked) {
		d.s.log.Debug("write deadline", "err", err)
	}
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	d.extend()
	return d.ResponseWriter.Write(b)
}

// Flush sends what is buffered (an SSE event).
func (d *deadlineWriter) Flush() {
	d.extend()
	if err := d.rc.Flush(); err != nil {
		d.s.log.Debug("flush", "err", err) // the client is gone: the request's context ends
	}
}

// Hijack hands the connection over (the websocket), deadlines and all:
// the websocket sets its own.
func (d *deadlineWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) { return d.rc.Hijack() }

// Unwrap lets http.ResponseController reach the connection's writer.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// timeoutError is a request or generation that ran past its time limit
// (the server's, not the client's: the client is still there).
type timeoutError struct {
	what  string // "the request", "the generation"
	limit time.Duration
	flag  string
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("%s ran past its time limit of %v (%s)", e.what, e.limit, e.flag)
}

// pastLimit tells apart a context that ended at the server's deadline from
// one whose client left: a *timeoutError for the first, nil otherwise.
func pastLimit(ctx context.Context, r *http.Request, what string, limit time.Duration, flag string) *timeoutError {
	if r.Context().Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &timeoutError{what, limit, flag}
	}
	return nil
}

// encodeSlots bounds the tokenizations running at once (text and
// messages, up to their bound each): past that many a request waits for
// a slot, as long as its context lasts. Tokenizing is CPU work; more at
// once than there are CPUs only adds memory.
func newEncodeSlots() chan struct{} { return make(chan struct{}, max(2, runtime.GOMAXPROCS(0))) }

// encode runs f (a tokenization) in an encode slot, once one is free; ctx's
// end stops the wait.
func (st *state) encode(ctx context.Context, f func()) error {
	select {
	case st.encodeSlots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-st.encodeSlots }()
	f()
	return nil
}
