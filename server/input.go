package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"webdraft/tokenizer"
)

// Strict input. Request bodies (and the page's websocket messages) are
// decoded by github.com/go-json-experiment/json, encoding/json v2's
// upstream, set to match member names exactly and to refuse duplicate
// names, invalid UTF-8 and unknown members; a hook refuses null wherever
// the endpoint does not take it as "absent". The inputs that make work —
// token ids, text, messages, stop strings — are decoded by the types
// below, which stop at their bound as they read, so that a request past a
// limit is refused before it is decoded whole or tokenized. The body is
// read through the request's context: a client that leaves stops the
// decoding.

// echoBytes bounds a value echoed in an error message.
const echoBytes = 64

// clip cuts s to echoBytes bytes (at a rune boundary) and marks the cut
// with "…".
func clip(s string) string {
	if len(s) <= echoBytes {
		return s
	}
	cut := echoBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// quote is %q of s, clipped: the mark of a cut stands after the quotes.
func quote(s string) string {
	if c := clip(s); c != s {
		return strconv.Quote(c[:len(c)-len("…")]) + "…"
	}
	return strconv.Quote(s)
}

// inputError is a request the server refuses before any work: a status,
// a code, the path of the offending field ("tokens[2]",
// "messages[0].role"; "body" for the body as a whole, "Content-Type" for
// the header) and what is wrong with it.
type inputError struct {
	status int
	code   string // invalid_request, unknown_field, body_too_large, body_timeout, unsupported_media_type, client_closed
	field  string
	msg    string
}

func (e *inputError) Error() string { return e.field + ": " + e.msg }

func invalidInput(field, format string, args ...any) *inputError {
	return &inputError{http.StatusBadRequest, "invalid_request", field, fmt.Sprintf(format, args...)}
}

// tooLongError is an input past the model's context: more token ids, text
// or messages than could fit. Each endpoint answers it as it answers a
// context too long (/draft 413, /v1/* 400).
type tooLongError struct {
	field string
	msg   string
}

func (e *tooLongError) Error() string { return e.field + ": " + e.msg }

// What the null hook refuses: a null, a null for a required field.
var (
	errNull         = errors.New("null")
	errNullRequired = errors.New("null for a required field")
)

// nullHook refuses a JSON null unless nullable takes it (returns nil);
// where it does, the field's default decoding treats null as absent.
func nullHook(nullable func(*jsontext.Decoder) error) *jsonv2.Unmarshalers {
	return jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, _ any) error {
		if dec.PeekKind() != 'n' {
			return jsonv2.SkipFunc
		}
		if err := nullable(dec); err != nil {
			return err
		}
		return jsonv2.SkipFunc
	})
}

var (
	// noNulls refuses every null: the server's own API and the page's
	// messages.
	noNulls = nullHook(func(*jsontext.Decoder) error { return errNull })
	// openAINulls takes null as absent for a top-level field but the
	// required ones, as OpenAI's API does for its optional fields (and
	// llama-server for /completion's); null anywhere else — an array's
	// element, a message's field, within an object — is refused.
	openAINulls = nullHook(func(dec *jsontext.Decoder) error {
		if dec.StackDepth() != 1 {
			return errNull
		}
		switch dec.StackPointer().LastToken() {
		case "prompt", "messages":
			return errNullRequired
		}
		return nil
	})
)

// decodeStrict decodes one JSON value from r into v, and refuses anything
// after it. nulls is noNulls or openAINulls. When r is a request body
// (*bodyReader) whose read failed — past the size limit, past the body
// timeout, the client gone — that failure is the error, whatever the
// decoder made of the input cut short.
func decodeStrict(r io.Reader, v any, nulls *jsonv2.Unmarshalers) error {
	dec := jsontext.NewDecoder(r, jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false))
	err := jsonv2.UnmarshalDecode(dec, v,
		jsonv2.MatchCaseInsensitiveNames(false), jsonv2.RejectUnknownMembers(true), jsonv2.WithUnmarshalers(nulls))
	if err == nil {
		switch _, err = dec.ReadToken(); {
		case err == io.EOF:
			return nil
		case err == nil || isSyntax(err):
			return invalidInput("body", "trailing data after the JSON object")
		}
	}
	if br, ok := r.(*bodyReader); ok && br.err != nil {
		err = br.err
	}
	return inputErrorOf(err, dec.InputOffset() == 0)
}

func isSyntax(err error) bool {
	var sy *jsontext.SyntacticError
	return errors.As(err, &sy)
}

// inputErrorOf makes a decoding error an *inputError or a *tooLongError
// that names the field; empty tells that nothing had been read.
func inputErrorOf(err error, empty bool) error {
	var (
		ie       *inputError
		tl       *tooLongError
		tooBig   *http.MaxBytesError
		syntax   *jsontext.SyntacticError
		semantic *jsonv2.SemanticError
	)
	var late *bodyTimeoutError
	switch {
	case errors.As(err, &late):
		return &inputError{http.StatusRequestTimeout, "body_timeout", "body", late.Error()}
	case errors.As(err, &tooBig):
		return &inputError{http.StatusRequestEntityTooLarge, "body_too_large", "body", fmt.Sprintf("larger than %d bytes", tooBig.Limit)}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &inputError{499, "client_closed", "body", "the client went away"}
	case errors.As(err, &ie):
		return ie
	case errors.As(err, &tl):
		return tl
	case errors.As(err, &syntax):
		switch {
		case errors.Is(syntax.Err, jsontext.ErrDuplicateName):
			return invalidInput(fieldPath(syntax.JSONPointer), "a duplicate field")
		case errors.Is(syntax.Err, io.ErrUnexpectedEOF):
			return invalidInput("body", "malformed JSON: unexpected end")
		}
		in := ""
		if syntax.JSONPointer != "" {
			in = " (in " + fieldPath(syntax.JSONPointer) + ")"
		}
		return invalidInput("body", "malformed JSON at byte %d%s: %s", syntax.ByteOffset, in, clip(syntax.Err.Error()))
	case errors.As(err, &semantic):
		field := fieldPath(semantic.JSONPointer)
		switch {
		case errors.Is(semantic.Err, errNullRequired):
			return invalidInput(field, "null: the field is required")
		case errors.Is(semantic.Err, errNull):
			switch _, err := strconv.ParseUint(semantic.JSONPointer.LastToken(), 10, 0); {
			case semantic.JSONPointer == "":
				return invalidInput(field, "null: want a JSON object")
			case err == nil: // an array's element
				return invalidInput(field, "null: want a value")
			}
			return invalidInput(field, "null: give a value or leave the field out")
		case errors.Is(semantic.Err, jsonv2.ErrUnknownName):
			return &inputError{http.StatusBadRequest, "unknown_field", field, "unknown field"}
		}
		return invalidInput(field, "want %s, got %s", goKind(semantic.GoType), jsonKind(semantic.JSONKind, semantic.JSONValue))
	case errors.Is(err, io.EOF) && empty:
		return invalidInput("body", "empty body: want a JSON object")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return invalidInput("body", "malformed JSON: unexpected end")
	}
	return invalidInput("body", "%s", clip(err.Error()))
}

// fieldPath writes a JSON pointer as the field's path: /messages/0/role
// is messages[0].role, the empty pointer "body". Names are clipped, and so
// is a path past 2×echoBytes.
func fieldPath(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if b.Len() > 2*echoBytes { // deep in a raw value: the path is clipped too
			b.WriteString("…")
			break
		}
		if _, err := strconv.ParseUint(tok, 10, 0); err == nil {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(clip(tok))
	}
	if b.Len() == 0 {
		return "body"
	}
	return b.String()
}

// goKind names what a Go type takes, in JSON's words.
func goKind(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "another value"
}

// jsonKind names a JSON value's kind; a number that is not one the field
// takes is shown, clipped.
func jsonKind(k jsontext.Kind, v jsontext.Value) string {
	switch k {
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '"':
		return "a string"
	case '0':
		if len(v) > 0 {
			return "the number " + clip(string(v))
		}
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "an array"
	}
	return "another value"
}

// kindOf names the kind of the next value in dec.
func kindOf(dec *jsontext.Decoder) string { return jsonKind(dec.PeekKind(), nil) }

// bodyReader reads a request body r until ctx ends, and keeps the first
// error that is not the body's end.
type bodyReader struct {
	ctx context.Context
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := 0, b.ctx.Err()
	if err == nil {
		n, err = b.r.Read(p)
	}
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// requestBody checks a POST's headers — Content-Type application/json
// (parameters allowed; a charset must be UTF-8), a declared length within
// MaxBodyBytes — and returns its body, bounded by MaxBodyBytes and read
// until the client leaves. A declared length over the limit is refused
// without reading the body.
func requestBody(w http.ResponseWriter, r *http.Request) (io.Reader, *inputError) {
	ct := r.Header.Get("Content-Type")
	unsupported := func(msg string) *inputError {
		return &inputError{http.StatusUnsupportedMediaType, "unsupported_media_type", "Content-Type", msg + ": send the body as application/json"}
	}
	if ct == "" {
		return nil, unsupported("missing")
	}
	mt, params, err := mime.ParseMediaType(ct)
	switch {
	case err != nil:
		return nil, unsupported(fmt.Sprintf("%s is not a media type", quote(ct)))
	case mt != "application/json":
		return nil, unsupported(quote(mt))
	case params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8"):
		return nil, unsupported(fmt.Sprintf("charset %s", quote(params["charset"])))
	}
	if r.ContentLength > MaxBodyBytes {
		return nil, &inputError{http.StatusRequestEntityTooLarge, "body_too_large", "body",
			fmt.Sprintf("Content-Length %d is larger than %d bytes", r.ContentLength, MaxBodyBytes)}
	}
	return &bodyReader{ctx: r.Context(), r: http.MaxBytesReader(w, r.Body, MaxBodyBytes)}, nil
}

// textBound is the longest text, in bytes, that might encode to at most
// tokens ids with tok: no id stands for more than tok's longest token,
// and Unicode normalization shrinks text by at most 3× (Hangul jamo into
// syllables), 4× here for a margin. A longer text cannot fit: it is
// refused before it is tokenized. Without a tokenizer text is refused
// whatever its length: only the body limit bounds it.
func textBound(tok *tokenizer.Tokenizer, tokens int) int {
	if tok == nil {
		return MaxBodyBytes
	}
	longest := 1
	for id := range tok.VocabSize() {
		if b, err := tok.TokenBytes(id); err == nil { // ids the vocabulary leaves out have no bytes
			longest = max(longest, len(b))
		}
	}
	return tokens * longest * 4
}

// The bounded inputs. Each decodes from the JSON stream with
// UnmarshalJSONFrom (the null hook sees null before they do: when they
// see one, it is a top-level null taken as absent) and records whether
// it was given.

// idList is an array of token ids, at most max of them.
type idList struct {
	max int
	ids []int
	set bool
}

func (l *idList) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	if dec.PeekKind() == 'n' {
		_, err := dec.ReadToken()
		return err
	}
	field := fieldPath(dec.StackPointer())
	if dec.PeekKind() != '[' {
		return invalidInput(field, "want an array of token ids, got %s", kindOf(dec))
	}
	if _, err := dec.ReadToken(); err != nil {
		return err
	}
	ids, err := readIDs(dec, field, l.max)
	l.ids, l.set = ids, true
	return err
}

// readIDs reads token ids up to the end of the array that holds them
// (its '[' already read): at most max, each an integer.
func readIDs(dec *jsontext.Decoder, field string, max int) ([]int, error) {
	ids := []int{}
	for dec.PeekKind() != ']' {
		if len(ids) == max {
			return nil, &tooLongError{field, fmt.Sprintf("more than %d token ids", max)}
		}
		kind := kindOf(dec)
		tok, err := dec.ReadToken()
		if err != nil {
			return nil, err
		}
		at := fmt.Sprintf("%s[%d]", field, len(ids))
		if tok.Kind() != '0' {
			if tok.Kind() == '[' || tok.Kind() == '{' {
				return nil, invalidInput(at, "want a token id, got %s", kind)
			}
			return nil, invalidInput(at, "want a token id (an integer), got %s", kind)
		}
		id, err := strconv.Atoi(tok.String())
		if err != nil {
			return nil, invalidInput(at, "want a token id (an integer), got %s", clip(tok.String()))
		}
		ids = append(ids, id)
	}
	_, err := dec.ReadToken()
	return ids, err
}

// boundedText is a string of at most max bytes.
type boundedText struct {
	max  int
	text string
	set  bool
}

func (t *boundedText) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	if dec.PeekKind() == 'n' {
		_, err := dec.ReadToken()
		return err
	}
	field := fieldPath(dec.StackPointer())
	text, err := readText(dec, field, t.max)
	t.text, t.set = text, err == nil
	return err
}

// readText reads a string of at most max bytes.
func readText(dec *jsontext.Decoder, field string, max int) (string, error) {
	if dec.PeekKind() != '"' {
		return "", invalidInput(field, "want a string, got %s", kindOf(dec))
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return "", err
	}
	if s := tok.String(); len(s) <= max {
		return s, nil
	}
	return "", &tooLongError{field, fmt.Sprintf("more than %d bytes of text", max)}
}

// sized is a list item with text in it: its length in bytes.
type sized interface{ textBytes() int }

// boundedList is an array of at most max items whose text adds up to at
// most maxBytes; a null item is refused by the null hook.
type boundedList[T sized] struct {
	max, maxBytes int
	items         []T
	set           bool
}

func (l *boundedList[T]) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	if dec.PeekKind() == 'n' {
		_, err := dec.ReadToken()
		return err
	}
	field := fieldPath(dec.StackPointer())
	if dec.PeekKind() != '[' {
		return invalidInput(field, "want an array, got %s", kindOf(dec))
	}
	if _, err := dec.ReadToken(); err != nil {
		return err
	}
	l.items, l.set = []T{}, true
	size := 0
	for dec.PeekKind() != ']' {
		if len(l.items) == l.max {
			return &tooLongError{field, fmt.Sprintf("more than %d items", l.max)}
		}
		var item T
		if err := jsonv2.UnmarshalDecode(dec, &item); err != nil {
			return err
		}
		if size += item.textBytes(); size > l.maxBytes {
			return &tooLongError{field, fmt.Sprintf("more than %d bytes of text", l.maxBytes)}
		}
		l.items = append(l.items, item)
	}
	_, err := dec.ReadToken()
	return err
}

// promptField is /v1/completions' prompt: text, token ids, or a list
// holding one of those; at most maxIDs ids or maxBytes of text.
type promptField struct {
	maxIDs, maxBytes int
	ids              []int
	text             string
	isText, set      bool
	nested           bool // in a list: [[ids]] or ["text"]
}

func (p *promptField) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	field := fieldPath(dec.StackPointer())
	want := invalidInput(field, "want text, a list of token ids, or a list holding one of those")
	switch dec.PeekKind() {
	case '"':
		text, err := readText(dec, field, p.maxBytes)
		p.text, p.isText, p.set = text, true, err == nil
		return err
	case '[':
	default:
		return want
	}
	if _, err := dec.ReadToken(); err != nil {
		return err
	}
	p.set = true
	var err error
	switch dec.PeekKind() {
	case ']', '0':
		p.ids, err = readIDs(dec, field, p.maxIDs)
		return err
	case '"':
		p.isText, p.nested = true, true
		if p.text, err = readText(dec, field+"[0]", p.maxBytes); err != nil {
			return err
		}
	case '[':
		p.nested = true
		if _, err := dec.ReadToken(); err != nil {
			return err
		}
		if p.ids, err = readIDs(dec, field+"[0]", p.maxIDs); err != nil {
			return err
		}
	default:
		return want
	}
	if dec.PeekKind() != ']' {
		return invalidInput(field, "several prompts: webdraft takes one a request")
	}
	_, err = dec.ReadToken()
	return err
}

// stopField is stop: a string, or up to MaxStops strings.
type stopField struct {
	stops []string
	set   bool
}

func (s *stopField) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	field := fieldPath(dec.StackPointer())
	switch dec.PeekKind() {
	case 'n':
		_, err := dec.ReadToken()
		return err
	case '"':
		tok, err := dec.ReadToken()
		s.stops, s.set = []string{tok.String()}, err == nil
		return err
	case '[':
	default:
		return invalidInput(field, "want a string or a list of strings, got %s", kindOf(dec))
	}
	if _, err := dec.ReadToken(); err != nil {
		return err
	}
	s.stops, s.set = []string{}, true
	for dec.PeekKind() != ']' {
		at := fmt.Sprintf("%s[%d]", field, len(s.stops))
		if len(s.stops) == MaxStops {
			return invalidInput(field, "more than %d stop strings", MaxStops)
		}
		if dec.PeekKind() != '"' {
			return invalidInput(at, "want a string, got %s", kindOf(dec))
		}
		tok, err := dec.ReadToken()
		if err != nil {
			return err
		}
		s.stops = append(s.stops, tok.String())
	}
	_, err := dec.ReadToken()
	return err
}
