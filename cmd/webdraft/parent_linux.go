package main

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// startParent is the parent process when webdraft started (read while the
// package initializes, as early as Go allows).
var startParent = os.Getppid()

// stopWithParent asks the kernel to send webdraft SIGTERM when the process
// that started it ends — task, when `go tool task serve` is stopped — so
// that the server drains and stops instead of running on, orphaned. (task
// itself answers a first SIGTERM by waiting for its command.) A parent that
// ended before the kernel was asked sends nothing: webdraft then sends
// itself the SIGTERM, which main's signal context turns into a stop.
func stopWithParent() error {
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGTERM), 0, 0, 0); err != nil {
		return err
	}
	if os.Getppid() != startParent {
		return syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
	return nil
}
