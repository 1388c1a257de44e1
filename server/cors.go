package server

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
)

// CORS is off unless origins are configured (Options.CORSOrigins, serve's
// --cors-origin): without them no answer carries Access-Control-* headers,
// so that a browser lets no other site's page read an answer, and a
// preflight (OPTIONS) gets 405 like any other method no route takes. With
// them, a request whose Origin is listed (or any, with "*") gets
// Access-Control-Allow-Origin naming it, and its preflight is answered 204
// before the API key is checked (browsers send none with it). The
// websocket takes the listed origins too, besides the server's own page.

// CheckOrigin validates a CORS origin as --cors-origin takes it: "*", or
// scheme://host[:port] with scheme http or https and nothing after.
func CheckOrigin(o string) error {
	if o == "*" {
		return nil
	}
	u, err := url.Parse(o)
	switch {
	case err != nil:
		return fmt.Errorf("origin %s: %w", quote(o), err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("origin %s: want http://host[:port] or https://host[:port], or *", quote(o))
	case u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("origin %s: want only a scheme, a host and a port, as a browser sends it in Origin", quote(o))
	}
	return nil
}

// origins is a set of allowed origins, as browsers send them: lower case,
// without a trailing slash.
type origins struct {
	any  bool
	list map[string]bool
}

func newOrigins(list []string) origins {
	o := origins{list: map[string]bool{}}
	for _, s := range list {
		if s == "*" {
			o.any = true
			continue
		}
		o.list[strings.ToLower(strings.TrimSuffix(s, "/"))] = true
	}
	return o
}

func (o origins) empty() bool { return !o.any && len(o.list) == 0 }

func (o origins) allows(origin string) bool {
	return origin != "" && (o.any || o.list[strings.ToLower(origin)])
}

// headerList is what a preflight may ask for in
// Access-Control-Request-Headers: header names, comma-separated.
var headerList = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_|~-]+)*$`)

// maxPreflightHeaders bounds the Access-Control-Request-Headers echoed.
const maxPreflightHeaders = 1024

// cors adds the CORS headers for an allowed origin and answers its
// preflights; with no origins configured it is next.
func (s *Server) cors(next http.Handler) http.Handler {
	if s.origins.empty() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Add("Vary", "Origin")
		origin := r.Header.Get("Origin")
		if !s.origins.allows(origin) {
			next.ServeHTTP(w, r)
			return
		}
		h.Set("Access-Control-Allow-Origin", origin)
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Add("Vary", "Access-Control-Request-Method")
			h.Add("Vary", "Access-Control-Request-Headers")
			h.Set("Access-Control-Allow-Methods", "GET, POST")
			asked := r.Header.Get("Access-Control-Request-Headers")
			if len(asked) <= maxPreflightHeaders && headerList.MatchString(asked) {
				h.Set("Access-Control-Allow-Headers", asked) // OpenAI's clients send headers of their own
			} else {
				h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
			}
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.Set("Access-Control-Expose-Headers", "Retry-After")
		next.ServeHTTP(w, r)
	})
}
