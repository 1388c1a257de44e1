package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"webdraft/engine"
	"webdraft/scheduler"
	"webdraft/server"
	"webdraft/tokenizer"
)

// drainTimeout bounds how long SIGTERM waits for in-flight requests.
const drainTimeout = 30 * time.Second

func runServe(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "serve", "[--model DIR] [--addr 127.0.0.1:8080] [--backend auto|webgpu|cpu] [--cache-mb N] [--chain-steps 8]")
	modelDir := fs.String("model", "", "model folder (webdraft convert output, or an HF checkpoint quantized on load); default: the embedded drafter")
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	backendFlag := fs.String("backend", "auto", backendUsage)
	cacheMB := fs.Int("cache-mb", 512, "KV-cache memory for running and cached sequences, in MiB")
	chainSteps := fs.Int("chain-steps", 8, "decode passes chained on the GPU when every request is decoding and none waits (1: one pass at a time)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *cacheMB < 1 {
		return usagef("--cache-mb %d: want at least 1", *cacheMB)
	}
	if *chainSteps < 1 || *chainSteps > maxDraft {
		return usagef("--chain-steps %d: want 1…%d", *chainSteps, maxDraft)
	}
	backend, err := parseBackend(*backendFlag)
	if err != nil {
		return err
	}
	if err := stopWithParent(); err != nil {
		return fmt.Errorf("asking to stop with the parent process: %w", err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := server.New(e.log)
	httpSrv := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- httpSrv.Serve(ln) }()
	e.log.Info("listening", "addr", ln.Addr().String())

	// Load while /health answers "loading".
	start := time.Now()
	model, name, err := loadModel(*modelDir)
	if err != nil {
		httpSrv.Close()
		return err
	}
	defer model.Close()
	tok, err := modelTokenizer(model)
	switch {
	case errors.Is(err, tokenizer.ErrNoTokenizer):
		e.log.Warn("serving token ids only", "reason", err)
	case err != nil:
		httpSrv.Close()
		return err
	}
	eng, err := openEngine(e, model, backend, int64(*cacheMB)<<20, 0)
	if err != nil {
		httpSrv.Close()
		return err
	}
	defer eng.Close()
	if err := engine.Warm(ctx, eng); err != nil {
		httpSrv.Close()
		return fmt.Errorf("warm-up: %w", err)
	}
	opts := scheduler.Options{ChainSteps: *chainSteps}
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- srv.Run(runCtx, server.Model{Name: name, Engine: eng, Tokenizer: tok}, opts)
	}()
	e.log.Info("loaded", "seconds", fmt.Sprintf("%.2f", time.Since(start).Seconds()), "cache_tokens", eng.KVCapacity())

	select {
	case <-ctx.Done(): // SIGTERM or interrupt: drain
	case err := <-served:
		stopRun()
		<-ran
		return fmt.Errorf("http: %w", err)
	}
	e.log.Info("shutting down: draining in-flight requests")
	drainCtx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	shutdownErr := httpSrv.Shutdown(drainCtx)
	stopRun()
	if err := <-ran; err != nil {
		return err
	}
	if shutdownErr != nil && !errors.Is(shutdownErr, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", shutdownErr)
	}
	e.log.Info("stopped")
	return nil
}
