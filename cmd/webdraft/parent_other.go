//go:build !linux

package main

// stopWithParent does nothing where the kernel cannot signal a process when
// its parent ends.
func stopWithParent() error { return nil }
