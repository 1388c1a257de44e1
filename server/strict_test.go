package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"webdraft/scheduler"
	"webdraft/tokenizer"
)

// The regression tests of strict input (issue 26, point 1): each case
// here was answered otherwise before it.

// errorOf reads the {"error": {…}} of a response body.
func errorOf(t *testing.T, body map[string]any) map[string]any {
	t.Helper()
	e, ok := body["error"].(map[string]any)
	if !ok {
		t.Fatalf("not an error: %v", body)
	}
	return e
}

// TestStrictDraftInput: exact-case names, no duplicates, no nulls, and a
// message's content required — each a 400 naming the field.
func TestStrictDraftInput(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	for _, c := range []struct{ name, body, field string }{
		{"null token", `{"tokens":[1,null,2]}`, "tokens[1]"},
		{"case and null", `{"Tokens":[1],"tokens":null,"TEXT":"a"}`, "Tokens"},
		{"upper case", `{"TOKENS":[1,2]}`, "TOKENS"},
		{"upper case n", `{"tokens":[1],"N":3}`, "N"},
		{"duplicate", `{"tokens":[1],"tokens":[2]}`, "tokens"},
		{"duplicate escaped", `{"tokens":[1],"tok\u0065ns":[2]}`, "tokens"},
		{"duplicate session", `{"tokens":[1],"session":"a","session":"b"}`, "session"},
		{"null tokens", `{"tokens":null,"text":"a"}`, "tokens"},
		{"null n", `{"tokens":[1],"n":null}`, "n"},
		{"null p_min", `{"tokens":[1],"p_min":null}`, "p_min"},
		{"null body", `null`, "body"},
		{"missing content", `{"messages":[{"role":"user"}]}`, "messages[0].content"},
		{"null content", `{"messages":[{"role":"user","content":null}]}`, "messages[0].content"},
		{"null message", `{"messages":[null]}`, "messages[0]"},
		{"null role", `{"messages":[{"role":null,"content":"a"}]}`, "messages[0].role"},
		{"unknown message field", `{"messages":[{"role":"user","content":"a","Content":"b"}]}`, "messages[0].Content"},
		{"invalid UTF-8", "{\"text\":\"a\xffb\"}", "body"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, out := post(t, f.url, c.body)
			e := errorOf(t, out)
			msg, _ := e["message"].(string)
			if code != http.StatusBadRequest || e["code"] != "invalid_request" || !strings.HasPrefix(msg, c.field+": ") {
				t.Errorf("%s: %d %v; want a 400 naming %s", c.body, code, out, c.field)
			}
			if strings.HasPrefix(c.name, "null") && !strings.Contains(msg, "null") {
				t.Errorf("%s: %q does not say null is refused", c.body, msg)
			}
		})
	}
}

// TestContentType: a POST body must be sent as application/json
// (parameters allowed, a charset UTF-8); anything else is a 415 in the
// JSON error shape.
func TestContentType(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	send := func(ct string) (int, map[string]any) {
		req, err := http.NewRequest("POST", f.url+"/draft", strings.NewReader(`{"tokens":[1,2,3],"n":2}`))
		if err != nil {
			t.Fatal(err)
		}
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("Content-Type %q: the answer is not JSON: %v", ct, err)
		}
		return resp.StatusCode, out
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"} {
		if code, out := send(ct); code != http.StatusOK {
			t.Errorf("Content-Type %q: %d %v", ct, code, out)
		}
	}
	for _, ct := range []string{"", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
		"multipart/form-data; boundary=x", "application/json; charset=iso-8859-1", "application/jsonx", "nonsense;;"} {
		code, out := send(ct)
		if e := errorOf(t, out); code != http.StatusUnsupportedMediaType || e["code"] != "unsupported_media_type" ||
			!strings.HasPrefix(e["message"].(string), "Content-Type: ") {
			t.Errorf("Content-Type %q: %d %v; want 415", ct, code, out)
		}
	}
}

// TestDeclaredLengthOverLimit: a Content-Length over the body limit is
// answered 413 at once, without waiting for the body.
func TestDeclaredLengthOverLimit(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(conn, "POST /draft HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"tokens\":[1,", MaxBodyBytes+1); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer while the body is not sent: %v", err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if e := errorOf(t, out); resp.StatusCode != http.StatusRequestEntityTooLarge || e["code"] != "body_too_large" {
		t.Errorf("%d %v; want 413 body_too_large", resp.StatusCode, out)
	}
}

// countingReader counts the bytes read from r, and calls cancel (when
// set) once more than cancelAfter have been.
type countingReader struct {
	r           io.Reader
	n           int
	cancelAfter int
	cancel      func()
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	if c.cancel != nil && c.n > c.cancelAfter {
		c.cancel()
	}
	return n, err
}

// spaces is an endless body of blanks.
type spaces struct{}

func (spaces) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	return len(p), nil
}

// serveCounted serves one request in-process with body as its body, and
// returns the answer and the bytes the server read.
func serveCounted(t *testing.T, h http.Handler, ctx context.Context, path string, body *countingReader) (*httptest.ResponseRecorder, map[string]any) {
	t.Helper()
	req := httptest.NewRequestWithContext(ctx, "POST", path, body)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var out map[string]any
	if err := json.NewDecoder(rec.Body).Decode(&out); err != nil {
		t.Fatalf("%s: the answer is not JSON: %v", path, err)
	}
	return rec, out
}

// TestLimitsWhileReading: token ids, text and messages past the model's
// context are refused as they are read, not after the body is decoded
// whole; text past it is refused before it is tokenized.
func TestLimitsWhileReading(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	h := f.srv.Handler()
	// Bodies of about 4 MB; the text is over the 256 KiB that 512
	// positions bound it to (textBound).
	for _, c := range []struct {
		name, body, field string
		readAtMost        int
	}{
		{"token ids", `{"tokens":[` + strings.Repeat("1,", 2_000_000) + `1],"n":1}`, "tokens", 256 << 10},
		{"text", `{"text":"` + strings.Repeat("a", 300_000) + `","session":"` + strings.Repeat("s", 3_800_000) + `"}`, "text", 1 << 20},
		{"messages", `{"messages":[` + strings.Repeat(`{"role":"user","content":"a"},`, 130_000) + `{"role":"user","content":"a"}]}`, "messages", 256 << 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			if len(c.body) >= MaxBodyBytes {
				t.Fatalf("the body is %d bytes: over the limit", len(c.body))
			}
			body := &countingReader{r: strings.NewReader(c.body)}
			rec, out := serveCounted(t, h, context.Background(), "/draft", body)
			e := errorOf(t, out)
			if rec.Code != http.StatusRequestEntityTooLarge || e["code"] != "context_too_large" || !strings.HasPrefix(e["message"].(string), c.field+": ") {
				t.Errorf("%d %v; want 413 context_too_large naming %s", rec.Code, out, c.field)
			}
			if body.n > c.readAtMost {
				t.Errorf("read %d bytes of %d before refusing; want at most %d", body.n, len(c.body), c.readAtMost)
			}
		})
	}

	// 4 MiB of text is refused without being tokenized: the request
	// allocates less than the tokenizer alone would.
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("a", MaxBodyBytes-64)
	encode := allocated(func() { tok.Encode(text) })
	var rec *httptest.ResponseRecorder
	var out map[string]any
	took := allocated(func() {
		rec, out = serveCounted(t, h, context.Background(), "/draft", &countingReader{r: strings.NewReader(`{"text":"` + text + `"}`)})
	})
	if e := errorOf(t, out); rec.Code != http.StatusRequestEntityTooLarge || e["code"] != "context_too_large" {
		t.Errorf("4 MiB of text: %d %v; want 413 context_too_large", rec.Code, out)
	}
	if took > refusalAllocs || took > encode/2 {
		t.Errorf("4 MiB of text refused after allocating %d MB; tokenizing it allocates %d MB", took>>20, encode>>20)
	}
}

// refusalAllocs bounds what refusing a body of about 4 MiB may allocate:
// its read buffer and one copy of its text (about 12 MB here).
const refusalAllocs = 6 * MaxBodyBytes

// allocated is how many bytes f allocates (the process's, while f runs).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestClientGoneStopsReading: when the request's context ends (the
// client left) the body is no longer read.
func TestClientGoneStopsReading(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := &countingReader{r: io.MultiReader(strings.NewReader(`{"tokens":[1,`), spaces{}), cancelAfter: 64 << 10, cancel: cancel}
	rec, out := serveCounted(t, f.srv.Handler(), ctx, "/draft", body)
	if e := errorOf(t, out); rec.Code != 499 || e["code"] != "client_closed" {
		t.Errorf("%d %v; want 499 client_closed", rec.Code, out)
	}
	if body.n > 256<<10 {
		t.Errorf("read %d bytes, the client gone after %d", body.n, 64<<10)
	}
}

// TestEchoClipped: a value an error message echoes is cut to 64 bytes
// and "…".
func TestEchoClipped(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	long := strings.Repeat("x", 200_000) // under the 256 KiB that bounds text (a role is text)
	for _, body := range []string{
		`{"messages":[{"role":"` + long + `","content":"hi"}]}`,
		`{"tokens":[1],"` + long + `":1}`,
		`{"tokens":[1` + strings.Repeat("0", 100_000) + `]}`,
		`{"tokens":[1],"n":1` + strings.Repeat("0", 100_000) + `}`,
	} {
		code, _, out := post(t, f.url, body)
		msg, _ := errorOf(t, out)["message"].(string)
		if code != http.StatusBadRequest || len(msg) > 300 || !strings.Contains(msg, "…") {
			t.Errorf("%.40s…: %d, a message of %d bytes: %.200s", body, code, len(msg), msg)
		}
	}
}

// TestRouteErrors: every response carries nosniff; a path or method no
// route takes is answered in JSON, in OpenAI's shape under /v1/.
func TestRouteErrors(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	do := func(method, path string) (*http.Response, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, f.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var out map[string]any
		if resp.StatusCode >= 400 {
			if err := json.Unmarshal(b, &out); err != nil || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("%s %s: %d %q (%s) is not a JSON error", method, path, resp.StatusCode, b, resp.Header.Get("Content-Type"))
			}
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s %s: %d without X-Content-Type-Options: nosniff", method, path, resp.StatusCode)
		}
		return resp, out
	}
	for _, path := range []string{"/health", "/metrics", "/", "/static/app.js"} {
		if resp, _ := do("GET", path); resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
	}
	if _, hdr, _ := post(t, f.url, `{"tokens":[1,2],"n":2}`); hdr.Get("X-Content-Type-Options") != "nosniff" {
		t.Error("POST /draft without nosniff")
	}
	for _, c := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/nope", 404, "not_found", ""},
		{"GET", "/static/nope.js", 404, "not_found", ""},
		{"GET", "/sessions/nope/events", 404, "no_session", ""},
		{"GET", "/draft", 405, "method_not_allowed", "POST"},
		{"DELETE", "/health", 405, "method_not_allowed", "GET, HEAD"},
	} {
		resp, out := do(c.method, c.path)
		if out == nil {
			continue
		}
		e := errorOf(t, out)
		if resp.StatusCode != c.status || e["code"] != c.code || e["message"] == "" || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d %v (Allow %q); want %d %s", c.method, c.path, resp.StatusCode, out, resp.Header.Get("Allow"), c.status, c.code)
		}
	}
	// Under /v1/: OpenAI's shape.
	for _, c := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v1/nope", 404, "not_found"},
		{"GET", "/v1/chat/completions", 405, "method_not_allowed"},
		{"PUT", "/v1/models", 405, "method_not_allowed"},
	} {
		resp, out := do(c.method, c.path)
		if out == nil {
			continue
		}
		e := errorOf(t, out)
		if _, hasParam := e["param"]; resp.StatusCode != c.status || e["code"] != c.code || e["type"] != "invalid_request_error" || !hasParam || e["message"] == "" {
			t.Errorf("%s %s: %d %v; want %d %s in OpenAI's shape", c.method, c.path, resp.StatusCode, out, c.status, c.code)
		}
	}
}

// TestOpenAIStrictInput: the OpenAI-compatible API decodes as strictly,
// answering in OpenAI's shape with param naming the field; a top-level
// optional field set to null counts as absent, as in OpenAI's API.
func TestOpenAIStrictInput(t *testing.T) {
	f := newPairFixture(t, testKey)
	hi := `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{"model":"target","messages":[{"role":"user"}]}`, "messages[0].content"},
		{"/v1/chat/completions", `{"model":"target","messages":[{"role":"user","content":null}]}`, "messages[0].content"},
		{"/v1/chat/completions", `{"model":"target","messages":[{"role":"user","content":[{"type":"text","text":null}]}]}`, "messages[0].content[0].text"},
		{"/v1/chat/completions", `{"model":"target","messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages[0].content[0].text"},
		{"/v1/chat/completions", `{"model":"target","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "messages[0].content[0].type"},
		{"/v1/chat/completions", `{"model":"target","messages":[null]}`, "messages[0]"},
		{"/v1/chat/completions", `{"model":"target",` + hi + `,"Model":"x"}`, "Model"},
		{"/v1/chat/completions", `{"model":"target","model":"target",` + hi + `}`, "model"},
		{"/v1/chat/completions", `{"model":7,` + hi + `}`, "model"},
		{"/v1/chat/completions", `{"model":"target","messages":null}`, "messages"},
		{"/v1/chat/completions", `{"model":"target",` + hi + `,"speculative":{"k":null}}`, "speculative.k"},
		{"/v1/chat/completions", `{"model":"target",` + hi + `,"stream_options":{"Include_Usage":true},"stream":true}`, "stream_options.Include_Usage"},
		{"/v1/completions", `{"model":"target","prompt":[1,null,2]}`, "prompt[1]"},
		{"/v1/completions", `{"model":"target","prompt":null}`, "prompt"},
		{"/v1/completions", `{"model":"target","prompt":"x","PROMPT":"y"}`, "PROMPT"},
		{"/v1/completions", `{"model":"target","prompt":[[1,null]]}`, "prompt[0][1]"},
		{"/v1/completions", `{"model":"target","prompt":"x","stop":["a",null]}`, "stop[1]"},
	} {
		code, out := f.postJSON(t, c.path, c.body)
		e := errorOf(t, out)
		if code != 400 || e["param"] != c.param || e["type"] != "invalid_request_error" || !strings.HasPrefix(e["message"].(string), c.param+": ") {
			t.Errorf("%s %s: %d %v, want a 400 naming %q", c.path, c.body, code, out, c.param)
		}
	}
	// Top-level optional nulls are absent; model is optional (the target).
	if code, out := f.postJSON(t, "/v1/completions", `{"model":null,"prompt":"x","max_tokens":2,"stop":null,"temperature":null,"seed":null,"logit_bias":null,"stream_options":null,"n":null,"user":null}`); code != 200 {
		t.Errorf("top-level nulls: %d %v", code, out)
	}

	// A text/plain body: 415 in OpenAI's shape.
	req, err := http.NewRequest("POST", f.url+"/v1/chat/completions", strings.NewReader(`{"model":"target",`+hi+`}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if e := errorOf(t, out); resp.StatusCode != http.StatusUnsupportedMediaType || e["code"] != "unsupported_media_type" || e["type"] != "invalid_request_error" {
		t.Errorf("text/plain: %d %v", resp.StatusCode, out)
	}

	// Token ids, text and messages past the context: refused as read,
	// context_length_exceeded naming the field.
	h := f.srv.Handler()
	for _, c := range []struct{ path, body, param string }{
		{"/v1/completions", `{"model":"target","prompt":[` + strings.Repeat("1,", 2_000_000) + `1]}`, "prompt"},
		{"/v1/completions", `{"model":"target","prompt":[[` + strings.Repeat("1,", 2_000_000) + `1]]}`, "prompt[0]"},
		{"/v1/chat/completions", `{"model":"target","messages":[` + strings.Repeat(`{"role":"user","content":"a"},`, 130_000) + `{"role":"user","content":"a"}]}`, "messages"},
		{"/v1/completions", `{"model":"target","prompt":"` + strings.Repeat("a", MaxBodyBytes-100) + `"}`, "prompt"},
	} {
		body := &countingReader{r: strings.NewReader(c.body)}
		req := httptest.NewRequest("POST", c.path, body)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+testKey)
		rec := httptest.NewRecorder()
		took := allocated(func() { h.ServeHTTP(rec, req) })
		var out map[string]any
		if err := json.NewDecoder(rec.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		e := errorOf(t, out)
		if rec.Code != 400 || e["code"] != "context_length_exceeded" || e["param"] != c.param {
			t.Errorf("%s %.60s…: %d %v; want 400 context_length_exceeded naming %s", c.path, c.body, rec.Code, out, c.param)
		}
		if strings.Contains(c.body, `"prompt":"`) {
			if took > refusalAllocs { // tokenizing it allocates about 90 MB
				t.Errorf("%s: 4 MiB of text refused after allocating %d MB", c.path, took>>20)
			}
		} else if body.n > 256<<10 {
			t.Errorf("%s %.60s…: read %d bytes of %d before refusing", c.path, c.body, body.n, len(c.body))
		}
	}

	// Echoed values are clipped.
	code, out := f.postJSON(t, "/v1/chat/completions", `{"model":"target","messages":[{"role":"`+strings.Repeat("r", 100_000)+`","content":"hi"}]}`)
	if msg := errorOf(t, out)["message"].(string); code != 400 || len(msg) > 300 || !strings.Contains(msg, "…") {
		t.Errorf("a long role: %d, a message of %d bytes", code, len(msg))
	}
	code, out = f.postJSON(t, "/v1/chat/completions", `{"model":"`+strings.Repeat("m", 100_000)+`",`+hi+`}`)
	if msg := errorOf(t, out)["message"].(string); code != 404 || len(msg) > 300 || !strings.Contains(msg, "…") {
		t.Errorf("a long model: %d, a message of %d bytes", code, len(msg))
	}
}
