package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// authorize wraps the API: with an API key set, every request but GET
// /health and the page's files (/, /static/ and the browser engine's
// build, /wasm/) must carry
// "Authorization: Bearer KEY" (as OpenAI's clients send their api_key) —
// or, on the websocket, the subprotocol "webdraft.bearer.KEY", which a
// browser can send; others get a 401 in the shape of their endpoint's
// errors.
func (s *Server) authorize(next http.Handler) http.Handler {
	if s.apiKey == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		open := r.URL.Path == "/health" || r.URL.Path == "/" || strings.HasPrefix(r.URL.Path, "/static/") || strings.HasPrefix(r.URL.Path, "/wasm/")
		if open || s.keyMatches(r.Header.Get("Authorization"), "Bearer ") || r.URL.Path == "/ws" && s.wsKey(r) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="webdraft"`)
		code := "unauthorized"
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			code = "invalid_api_key" // OpenAI's
		}
		s.failRoute(w, r, http.StatusUnauthorized, code, "a missing or wrong API key: send Authorization: Bearer KEY")
	})
}

// keyMatches reports whether got is prefix followed by the API key. It
// compares SHA-256 digests in constant time, so that neither the key's
// bytes nor its length show in how long a wrong guess takes.
func (s *Server) keyMatches(got, prefix string) bool {
	want := sha256.Sum256([]byte(prefix + s.apiKey))
	have := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(have[:], want[:]) == 1
}
