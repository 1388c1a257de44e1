package gpu

import (
	"errors"
	"os"
	"reflect"
	"testing"
)

// TestBindGroupsReused: a forward pass's bind groups are made once and
// reused by later batches (params at other offsets included); releasing a
// buffer drops the groups that bind it.
func TestBindGroupsReused(t *testing.T) {
	d, err := Open(Options{})
	if errors.Is(err, ErrNoAdapter) && os.Getenv("CI") != "true" {
		t.Skip("no WebGPU adapter")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	k := Kernel{Module: "inc_test.wgsl", Entry: "main", Params: reflect.TypeFor[incParams](), Storage: []Access{ReadWrite}, Source: `
struct Params { add: f32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(1)
fn main() { y[0] += p.add; }`}
	p, err := d.Pipeline(k, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := d.UploadF32("y", []float32{0})
	if err != nil {
		t.Fatal(err)
	}
	for batch := range 3 {
		b, err := d.NewBatch("inc")
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 { // five params slots, one bind group
			add := float32(batch*5 + i + 1)
			if err := Dispatch(b, p, &incParams{Add: add}, []Binding{buf.All()}, 1, 1, 1); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Submit(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := buf.ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 120 { // 1 + 2 + … + 15
		t.Errorf("y = %v, want 120: the dynamic params offsets were not honoured", got[0])
	}
	if n := len(d.binds.groups); n != 1 {
		t.Errorf("%d bind groups cached, want 1", n)
	}
	buf.Release()
	if n := len(d.binds.groups); n != 0 {
		t.Errorf("%d bind groups left after releasing their buffer", n)
	}
}

// incParams is inc_test.wgsl's params.
type incParams struct {
	Add     float32
	_, _, _ uint32
}
