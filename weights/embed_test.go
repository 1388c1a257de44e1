//go:build !webdraft_noembed

package weights

import (
	"testing"
	"testing/fstest"
)

// TestFS holds the embedded folders to io/fs's rules: every file reads
// the same through Open, ReadFile and ReadDir, the weights included.
func TestFS(t *testing.T) {
	if err := fstest.TestFS(FS(), "drafter/config.json", "drafter/model.safetensors", "target/config.json", "target/model.safetensors", "eagle3/config.json", "eagle3/model.safetensors"); err != nil {
		t.Fatal(err)
	}
}
