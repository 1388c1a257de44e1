package server

import (
	"strings"

	"webdraft/tokenizer"
)

// textStream turns generated tokens into the text a client sees: bytes of
// an unfinished UTF-8 sequence are held back until the next tokens
// complete it, and so is text that may be the start of a stop string,
// until it cannot be; at the first stop string the text ends, the stop
// string left out.
type textStream struct {
	dec     *tokenizer.StreamDecoder
	stops   []string
	held    string // decoded, not yet released
	stopped bool   // a stop string came: nothing more is released
}

func newTextStream(tok *tokenizer.Tokenizer, stops []string) *textStream {
	return &textStream{dec: tok.NewStreamDecoder(), stops: stops}
}

// push decodes ids and returns the text they release.
func (s *textStream) push(ids []int) (string, error) {
	if s.stopped {
		return "", nil
	}
	for _, id := range ids {
		piece, err := s.dec.Next(id)
		if err != nil {
			return "", err
		}
		s.held += piece
	}
	// Any stop string starts within held: what was released could not
	// begin one.
	if at, ok := firstStop(s.held, s.stops); ok {
		out := s.held[:at]
		s.held, s.stopped = "", true
		return out, nil
	}
	keep := 0
	for _, stop := range s.stops {
		for n := min(len(stop)-1, len(s.held)); n > keep; n-- {
			if strings.HasSuffix(s.held, stop[:n]) {
				keep = n
				break
			}
		}
	}
	out := s.held[:len(s.held)-keep]
	s.held = s.held[len(s.held)-keep:]
	return out, nil
}

// firstStop is where in text the earliest of stops starts.
func firstStop(text string, stops []string) (int, bool) {
	at, found := len(text), false
	for _, stop := range stops {
		if i := strings.Index(text, stop); i >= 0 && i < at {
			at, found = i, true
		}
	}
	return at, found
}

// flush returns what is held back, at the end of the generation.
func (s *textStream) flush() string {
	if s.stopped {
		return ""
	}
	out := s.held + s.dec.Flush()
	s.held = ""
	if at, ok := firstStop(out, s.stops); ok { // completed by the flushed bytes
		s.stopped = true
		return out[:at]
	}
	return out
}
