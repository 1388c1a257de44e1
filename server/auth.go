package server

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// authorize wraps the API: with an API key set, every request but GET
// /health and the page's files (/ and /static/) must carry
// "Authorization: Bearer KEY" (as OpenAI's clients send their api_key) —
// or, on the websocket, the subprotocol "webdraft.bearer.KEY", which a
// browser can send; others get a 401 in the shape of their endpoint's
// errors.
func (s *Server) authorize(next http.Handler) http.Handler {
	if s.apiKey == "" {
		return next
	}
	want := []byte("Bearer " + s.apiKey)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		open := r.URL.Path == "/health" || r.URL.Path == "/" || strings.HasPrefix(r.URL.Path, "/static/")
		if open || subtle.ConstantTimeCompare(got, want) == 1 || r.URL.Path == "/ws" && s.wsKey(r) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="webdraft"`)
		msg := "a missing or wrong API key: send Authorization: Bearer KEY"
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			s.failOpenAI(w, &openAIError{http.StatusUnauthorized, "invalid_request_error", "", "invalid_api_key", msg})
			return
		}
		s.fail(w, &apiError{http.StatusUnauthorized, "unauthorized", msg})
	})
}
