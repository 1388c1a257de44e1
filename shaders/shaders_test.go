package shaders

import (
	"strings"
	"testing"
)

// TestLink: a kernel gets the prelude items it uses and those they use,
// after its own text, and no others; a name the prelude declares cannot be
// declared again.
func TestLink(t *testing.T) {
	src := "@group(0) @binding(0) var<uniform> p: MatMulParams;\n" +
		"// swizzle( in a comment is no use\n" +
		"fn main() { let c = codes(1u, 0u); let s = p.scale; }\n"
	got, err := Link("test.wgsl", src)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, src) {
		t.Error("the kernel's own text does not come first")
	}
	for name, want := range map[string]bool{
		"struct MatMulParams": true, "fn codes(": true, "const MAGIC": true, "const BIAS": true, // codes uses MAGIC and BIAS
		"fn swizzle(": false, "fn scale(": false, "struct SplitParams": false, "fn split_sum(": false,
	} {
		if strings.Contains(got, name) != want {
			t.Errorf("%s linked: %v, want %v", name, !want, want)
		}
	}
	if _, err := Link("dup.wgsl", "fn swiglu(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> { return g; }\n"); err == nil {
		t.Error("a kernel redeclaring a prelude function was linked")
	}
	if plain, err := Link("plain.wgsl", "fn main() {}\n"); err != nil || plain != "fn main() {}\n" {
		t.Errorf("a kernel that uses nothing: %q, %v", plain, err)
	}
}

// TestModules: every kernel file links, each prelude item declared once and
// used by some kernel, and no kernel copies a prelude item.
func TestModules(t *testing.T) {
	mods, err := Modules()
	if err != nil {
		t.Fatal(err)
	}
	items, err := preludeItems()
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items.list {
		used := false
		for _, m := range mods {
			used = used || strings.Contains(m, it.text)
		}
		if !used {
			t.Errorf("prelude item %s is used by no kernel", it.name)
		}
	}
	if len(mods) < 10 {
		t.Errorf("%d kernels linked", len(mods))
	}
}

// BenchmarkModules is the linking of every kernel, which the package does
// once at start-up (in the browser, as the engine boots).
func BenchmarkModules(b *testing.B) {
	for b.Loop() {
		if _, err := Modules(); err != nil {
			b.Fatal(err)
		}
	}
}
