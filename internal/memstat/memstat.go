// Package memstat reads this process's resident memory from /proc (Linux),
// split into anonymous memory (the heap: what a program allocates) and
// file-backed pages (mapped files, which the kernel can drop at will).
package memstat

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// RSS is resident memory in bytes.
type RSS struct {
	Anon int64 // RssAnon
	File int64 // RssFile
}

// Read returns the current resident memory.
func Read() (RSS, error) { return read("/proc/self/status") }

// ReadProcess returns the current resident memory of process pid.
func ReadProcess(pid int) (RSS, error) { return read(fmt.Sprintf("/proc/%d/status", pid)) }

func read(path string) (RSS, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return RSS{}, fmt.Errorf("memory statistics need Linux's /proc: %w", err)
	}
	var r RSS
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			continue
		}
		switch string(f[0]) {
		case "RssAnon:":
			r.Anon = kb << 10
		case "RssFile:":
			r.File = kb << 10
		}
	}
	return r, nil
}

// Sampler tracks the peak of each figure while it runs.
type Sampler struct {
	stop chan struct{}
	wg   sync.WaitGroup
	peak RSS
}

// Sample reads the resident memory every interval until Stop.
func Sample(interval time.Duration) *Sampler {
	s := &Sampler{stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.observe()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *Sampler) observe() {
	if r, err := Read(); err == nil {
		s.peak.Anon = max(s.peak.Anon, r.Anon)
		s.peak.File = max(s.peak.File, r.File)
	}
}

// Stop ends sampling and returns the peaks seen.
func (s *Sampler) Stop() RSS {
	close(s.stop)
	s.wg.Wait()
	s.observe()
	return s.peak
}
