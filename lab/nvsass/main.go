// Command nvsass shows the machine code (SASS) that NVIDIA's Vulkan driver
// compiled for webdraft's WGSL kernels: per pipeline its instructions, its
// registers a thread and, for each loop, what its instructions are — the
// numbers behind "this multiply loop is 64 % FFMA, 16 % index clamps".
//
// NVIDIA's driver keeps what it compiles in its shader disk cache. Run a
// benchmark with the cache pointed at an empty folder, then nvsass on that
// folder, on a machine that has nvdisasm (CUDA's, /usr/local/cuda/bin on the
// H200 machine):
//
//	export __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1 __GL_SHADER_DISK_CACHE_PATH=/tmp/nvc
//	kernels.test -test.run '^$' -test.bench 'MatMulKernels/gate_up_2048x12288/T32/skinny$' -test.benchtime 10ms
//	nvsass -out /tmp/sass /tmp/nvc
//
// It writes each pipeline's code (NAME.code) and disassembly (NAME.sass) to
// -out and prints the summary. The cache's format is NVIDIA's and
// undocumented; what nvsass reads of it is described in cache.go.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "nvsass:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("nvsass", flag.ContinueOnError)
	out := fl.String("out", ".", "folder for each pipeline's .code and .sass")
	nvdisasm := fl.String("nvdisasm", "/usr/local/cuda/bin/nvdisasm", "CUDA's disassembler")
	arch := fl.String("arch", "SM90", "the GPU's architecture, as nvdisasm -b takes it (SM90: Hopper)")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "usage: nvsass [flags] CACHE_FOLDER_OR_FILE...\n\n"+
			"Disassembles the pipelines in NVIDIA shader disk cache files (*.bin).\n\n")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() == 0 {
		fl.Usage()
		return errors.New("no cache folder or file given")
	}
	files, err := cacheFiles(fl.Args())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", *out, err)
	}
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		pipes, err := carve(data)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		base := strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))
		for i, p := range pipes {
			name := filepath.Join(*out, fmt.Sprintf("%s_%d", base, i))
			if err := os.WriteFile(name+".code", p.Code, 0o644); err != nil {
				return fmt.Errorf("write %s.code: %w", name, err)
			}
			text, err := exec.Command(*nvdisasm, "-b", *arch, name+".code").Output()
			if err != nil {
				return fmt.Errorf("disassemble %s.code: %w%s", name, err, stderr(err))
			}
			if err := os.WriteFile(name+".sass", text, 0o644); err != nil {
				return fmt.Errorf("write %s.sass: %w", name, err)
			}
			fmt.Fprintf(stdout, "%s: %d registers a thread\n", name, p.Registers)
			fmt.Fprint(stdout, summarize(parseSASS(string(text))))
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("no compiled pipelines in %d cache file(s)", len(files))
	}
	return nil
}

// cacheFiles returns the *.bin files under each folder of paths, and each
// path that is a file.
func cacheFiles(paths []string) ([]string, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(path, ".bin") {
				files = append(files, path)
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("walk %s: %w", p, err)
		}
	}
	return files, nil
}

// stderr returns a failed command's standard error, for its error message.
func stderr(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return ": " + strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}
