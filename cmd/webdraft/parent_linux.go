package main

import "golang.org/x/sys/unix"

// stopWithParent asks the kernel to send webdraft SIGTERM when the process
// that started it ends — task, when `go tool task serve` is stopped — so
// that the server drains and stops instead of running on, orphaned. (task
// itself answers a first SIGTERM by waiting for its command.)
func stopWithParent() error {
	return unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGTERM), 0, 0, 0)
}
