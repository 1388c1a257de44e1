package main

import (
	"context"
	"errors"
)

// runServe is the HTTP drafter (CONTRACTS.md §4); it lands with the server.
func runServe(ctx context.Context, e *env, args []string) error {
	return errors.New("the HTTP server is not part of this build yet; `go tool task serve` drafts with the embedded model meanwhile")
}
