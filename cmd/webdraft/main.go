// Command webdraft is a speculative-decoding drafter for Qwen3: it converts
// Hugging Face checkpoints to its int4 format, drafts greedy tokens, serves
// drafts to a verifier over HTTP, and with a target verifying in the same
// process generates text by speculative decoding (behind an
// OpenAI-compatible API, or in the terminal).
//
// Exit status: 0 on success, 2 on a usage error, 1 on any other error (one line
// on stderr).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// command is one subcommand of webdraft.
type command struct {
	summary string
	run     func(ctx context.Context, env *env, args []string) error
}

// env is what a subcommand may touch: its streams and its logger.
type env struct {
	stdout io.Writer
	stderr io.Writer
	log    *slog.Logger
}

// commands lists every subcommand; each lives in its own file.
var commands = map[string]command{
	"convert":    {"convert a Hugging Face Qwen3 checkpoint, or an EAGLE-3 head, to a webdraft folder", runConvert},
	"draft":      {"draft the n greedy tokens that follow the input", runDraft},
	"generate":   {"generate text by speculative decoding in the terminal, then report τ and the speedup", runGenerate},
	"tokenize":   {"turn text into token ids (no special tokens added)", runTokenize},
	"detokenize": {"turn token ids into text", runDetokenize},
	"serve":      {"serve drafts, and speculative generation behind an OpenAI-compatible API, over HTTP", runServe},
	"loadtest":   {"load a server as verifiers would and report latency, throughput and cache reuse", runLoadtest},
	"bench":      {"run a benchmark and print its table", runBench},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one webdraft command line and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{
		stdout: stdout,
		stderr: stderr,
		log:    slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "webdraft: unknown command %q (run 'webdraft --help')\n", args[0])
		return 2
	}
	err := cmd.run(ctx, e, args[1:])
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "webdraft %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(stderr, "webdraft %s: %s\n", args[0], oneLine(err.Error()))
		return 1
	}
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: webdraft <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-11s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'webdraft <command> --help' for a command's flags.")
}

// usageError marks a bad command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// newFlags returns a flag set whose parse errors become usage errors and whose
// help text goes to stderr.
func newFlags(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: webdraft %s %s\n\nflags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs, mapping errors to usage errors and refusing
// stray positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// oneLine folds an error message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
