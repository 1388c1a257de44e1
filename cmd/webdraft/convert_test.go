package main

import (
	"path/filepath"
	"strings"
	"testing"

	"webdraft/checkpoint"
)

var eagle3Tiny = filepath.Join("..", "..", "testdata", "eagle3", "tiny")

// TestConvertEagle3Head: convert takes an EAGLE-3 head folder as well, and
// writes a converted head in the format asked for.
func TestConvertEagle3Head(t *testing.T) {
	for _, args := range [][]string{{"--quant", "f16"}, {"--group-size", "16"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "head")
			code, _, stderr := webdraft(t, append([]string{"convert", "--in", eagle3Tiny, "--out", out}, args...)...)
			if code != 0 {
				t.Fatalf("convert: exit %d: %s", code, stderr)
			}
			if !strings.Contains(stderr, `what="EAGLE-3 head"`) || strings.Contains(stderr, "skipped") {
				t.Errorf("stderr %q: want the head logged as converted, no tensor skipped", stderr)
			}
			h, err := checkpoint.LoadEagle3(out, checkpoint.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			want := checkpoint.F16
			if args[0] == "--group-size" {
				want = checkpoint.Int4
			}
			if !h.Converted || h.Quant != want || h.Config.DraftVocabSize != 40 {
				t.Errorf("converted %v, quant %s, draft vocabulary %d", h.Converted, h.Quant, h.Config.DraftVocabSize)
			}
		})
	}
}

// TestConvertEagle3HeadErrors: what does not apply to a head, or does not
// fit it, is one clear line on stderr.
func TestConvertEagle3HeadErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--head-tokens", "20"}, "--head-tokens"},
		{[]string{"--embedding-from", goldenTied}, "--embedding-from"},
		{nil, "group-size"}, // fc is 144 wide: not a multiple of the default 32
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			args := append([]string{"convert", "--in", eagle3Tiny, "--out", t.TempDir()}, c.args...)
			code, _, stderr := webdraft(t, args...)
			if code != 1 || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("exit %d, stderr %q: want exit 1 and one line naming %q", code, stderr, c.want)
			}
		})
	}
}

// TestConvertHelp: the usage text says that heads are taken.
func TestConvertHelp(t *testing.T) {
	code, _, stderr := webdraft(t, "convert", "--help")
	if code != 0 || !strings.Contains(stderr, "HEAD_DIR") || !strings.Contains(stderr, "EAGLE-3 head") {
		t.Errorf("exit %d, help %q", code, stderr)
	}
	code, _, stderr = webdraft(t)
	if code != 2 || !strings.Contains(stderr, "EAGLE-3 head") {
		t.Errorf("exit %d, usage %q: want the convert line to name heads", code, stderr)
	}
}
