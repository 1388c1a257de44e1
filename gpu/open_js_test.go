//go:build js

package gpu

import (
	"slices"
	"syscall/js"
	"testing"
)

// TestFeatureNames reads the features of a setlike shaped as Dawn's for
// Node has it (has, keys, size, Symbol.iterator; no forEach, no values)
// and of a browser's (a Set: forEach too).
//
//	GOOS=js GOARCH=wasm go test -exec "$(go env GOROOT)/lib/wasm/go_js_wasm_exec" ./gpu -run TestFeatureNames
func TestFeatureNames(t *testing.T) {
	want := []string{"subgroups", "timestamp-query", "shader-f16"}
	dawnLike := js.Global().Get("Function").New("names", `
		class GPUSupportedFeatures {
			#set;
			constructor(names) { this.#set = new Set(names); }
			has(name) { return this.#set.has(name); }
			keys() { return this.#set.keys(); }
			get size() { return this.#set.size; }
			[Symbol.iterator]() { return this.#set.values(); }
		}
		return new GPUSupportedFeatures(names);`)
	names := js.ValueOf([]any{want[0], want[1], want[2]})
	for _, tc := range []struct {
		name string
		set  js.Value
	}{
		{"dawn.node", dawnLike.Invoke(names)},
		{"browser", js.Global().Get("Set").New(names)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := featureNames(tc.set); !slices.Equal(got, want) {
				t.Errorf("featureNames = %q, want %q", got, want)
			}
		})
	}
	if dawnLike.Invoke(names).Get("forEach").Truthy() {
		t.Error("the Dawn-shaped setlike has forEach: the test does not test what it says")
	}
}
