package gpu

import "testing"

// TestPipelineKey: the per-dispatch key does not depend on the order a
// Consts map is walked in, and tells values, modules and sources apart.
func TestPipelineKey(t *testing.T) {
	k := Kernel{Module: "m.wgsl", Source: "const A: u32 = 1u;", Entry: "main"}
	consts := Consts{"A": 1, "B": 2, "C": 3, "D": 4, "E": 5}
	first, ok := newPipelineKey(k, consts)
	if !ok {
		t.Fatal("five constants did not fit the key")
	}
	for range 50 { // map iteration order varies from walk to walk
		if again, _ := newPipelineKey(k, consts); again != first {
			t.Fatalf("keys differ: %+v, %+v", again, first)
		}
	}
	other := Consts{"A": 1, "B": 2, "C": 3, "D": 4, "E": 6}
	if key, _ := newPipelineKey(k, other); key == first {
		t.Error("a different value gave the same key")
	}
	k2 := k
	k2.Source = "const A: u32 = 1u; " // another source under the same module name
	if key, _ := newPipelineKey(k2, consts); key == first {
		t.Error("another source gave the same key")
	}
	many := Consts{}
	for i := range maxKeyConsts + 1 {
		many[string(rune('a'+i))] = uint32(i)
	}
	if _, ok := newPipelineKey(k, many); ok {
		t.Error("more constants than the key holds were accepted")
	}
}
