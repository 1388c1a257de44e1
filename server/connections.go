package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The connection cap. Listener(ln) counts the connections open, from
// Accept to Close (a websocket's too, after it leaves net/http): up to
// MaxConnections they are served as usual; the next spareConnections are
// spare — served GET /health only, everything else a 503 naming the cap,
// each closed after its answer and given spareTime in all to send its
// request — so that a health check still gets an answer while slow or
// stalled clients hold every connection; past those a connection is
// refused at once: a canned 503, written without reading, then closed.
// The file descriptors the server holds for clients are so bounded by
// MaxConnections + spareConnections, and the timeouts (Limits) free the
// connections of clients that stall.

const (
	spareConnections = 16
	spareTime        = 2 * time.Second
)

// Listener wraps ln with s's connection cap. Serve s.HTTPServer() on it.
func (s *Server) Listener(ln net.Listener) net.Listener {
	return &capListener{Listener: ln, max: int64(s.limits.MaxConnections), open: &s.conns, s: s}
}

type capListener struct {
	net.Listener
	max  int64
	open *atomic.Int64 // the server's count (webdraft_open_connections)
	s    *Server
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n := l.open.Add(1)
		switch {
		case n <= l.max:
			return &cappedConn{Conn: c, l: l}, nil
		case n <= l.max+spareConnections:
			cc := &cappedConn{Conn: c, l: l, spare: true, until: time.Now().Add(spareTime)}
			if err := c.SetReadDeadline(cc.until); err != nil {
				l.s.log.Debug("a spare connection's deadline", "err", err)
				if err := cc.Close(); err != nil {
					l.s.log.Debug("closing a spare connection", "err", err)
				}
				continue
			}
			return cc, nil
		}
		l.refuse(c)
		l.open.Add(-1)
		l.s.metrics.refusedConns.Inc()
	}
}

// refuse answers a connection past every cap without reading from it.
func (l *capListener) refuse(c net.Conn) {
	body := fmt.Sprintf(`{"error":{"code":"too_many_connections","message":"%d connections are open, the most this server takes (--max-connections); retry shortly"}}`+"\n", l.max)
	resp := fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", retryAfter, len(body), body)
	err := c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	if err == nil {
		_, err = c.Write([]byte(resp))
	}
	if err != nil {
		l.s.log.Debug("refusing a connection", "err", err)
	}
	if err := c.Close(); err != nil {
		l.s.log.Debug("closing a refused connection", "err", err)
	}
}

// cappedConn is a connection the cap counts until it is closed. A spare
// one's read deadline never goes past its until.
type cappedConn struct {
	net.Conn
	l     *capListener
	spare bool
	until time.Time
	once  sync.Once
}

func (c *cappedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

func (c *cappedConn) SetReadDeadline(t time.Time) error {
	if c.spare && (t.IsZero() || t.After(c.until)) {
		t = c.until
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *cappedConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// CloseWrite half-closes a TCP connection, as net/http does before it
// closes one after an error answer.
func (c *cappedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// spareKey marks a request that came on a spare connection.
type spareKey struct{}

// connContext is http.Server's ConnContext: it marks the requests of a
// spare connection.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if cc, ok := c.(*cappedConn); ok && cc.spare {
		return context.WithValue(ctx, spareKey{}, true)
	}
	return ctx
}

// spareOnly answers the requests of a spare connection: GET /health is
// served, anything else gets 503 too_many_connections; either closes the
// connection after the answer.
func (s *Server) spareOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(spareKey{}) == nil {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		if r.Method == http.MethodGet && r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		s.failRoute(w, r, http.StatusServiceUnavailable, "too_many_connections",
			fmt.Sprintf("%d connections are open, the most this server takes (--max-connections); retry shortly", s.limits.MaxConnections))
	})
}
