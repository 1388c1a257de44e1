package gpu

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
)

// checkParams reports a Params type whose memory is not a WGSL uniform
// struct of u32 and f32 fields.
func checkParams(t reflect.Type) error {
	if t == nil {
		return nil
	}
	if t.Kind() != reflect.Struct || t.Size() == 0 || t.Size()%16 != 0 {
		return fmt.Errorf("params %v: want a struct of a positive multiple of 16 bytes", t)
	}
	for i := range t.NumField() {
		f := t.Field(i)
		ft := f.Type
		if ft.Kind() == reflect.Array {
			ft = ft.Elem()
		}
		if k := ft.Kind(); k != reflect.Uint32 && k != reflect.Float32 {
			return fmt.Errorf("params %v: field %s is %v, want uint32, float32 or an array of them", t, f.Name, f.Type)
		}
	}
	return nil
}

var (
	uniformVar  = regexp.MustCompile(`@binding\(0\)\s*var<uniform>\s*\w+\s*:\s*(\w+)\s*;`)
	structField = regexp.MustCompile(`^\s*(\w+)\s*:\s*(.+?)\s*$`)          // one field, its comma and comment cut
	wgslArray   = regexp.MustCompile(`^array<(vec4<(\w+)>|\w+),(\d+)u?>$`) // spaces removed
)

// CheckParams reports where kernel k's Params type and the WGSL struct of
// its uniform at binding 0 differ: the same fields in the same order, each
// of the same name (ignoring case and underscores; a blank Go field for a
// WGSL field named _…) and type (uint32 for u32, float32 for f32, [n]T for
// array<T, n>). Pipeline checks it; a test can without a device.
func CheckParams(k Kernel) error {
	m := uniformVar.FindStringSubmatch(k.Source)
	if k.Params == nil {
		if m != nil {
			return fmt.Errorf("%s declares uniform params %s; the kernel has no Params type", k.Module, m[1])
		}
		return nil
	}
	if m == nil {
		return fmt.Errorf("%s declares no uniform at binding 0 for params %v", k.Module, k.Params)
	}
	fields, err := wgslStruct(k.Source, m[1])
	if err != nil {
		return fmt.Errorf("%s: %w", k.Module, err)
	}
	t := k.Params
	if t.NumField() != len(fields) {
		return fmt.Errorf("%s: struct %s has %d fields, params %v %d", k.Module, m[1], len(fields), t, t.NumField())
	}
	for i, f := range fields {
		g := t.Field(i)
		name := strings.ToLower(strings.ReplaceAll(f.name, "_", ""))
		if strings.HasPrefix(f.name, "_") != (g.Name == "_") || g.Name != "_" && strings.ToLower(g.Name) != name {
			return fmt.Errorf("%s: field %d is %s in struct %s, %s in %v", k.Module, i, f.name, m[1], g.Name, t)
		}
		if want := goType(f.typ); want != g.Type.String() {
			return fmt.Errorf("%s: field %s is %s in WGSL, %v in %v (want %s)", k.Module, f.name, f.typ, g.Type, t, want)
		}
	}
	return nil
}

type wgslField struct{ name, typ string }

// wgslStruct returns the fields of `struct name { … }` in src.
func wgslStruct(src, name string) ([]wgslField, error) {
	start := regexp.MustCompile(`(?m)^\s*struct\s+` + name + `\s*\{`).FindStringIndex(src)
	if start == nil {
		return nil, fmt.Errorf("no struct %s", name)
	}
	body := src[start[1]:]
	end := strings.Index(body, "}")
	if end < 0 {
		return nil, fmt.Errorf("struct %s is not closed", name)
	}
	var fields []wgslField
	for _, line := range strings.Split(body[:end], "\n") {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "//") {
			continue
		}
		for _, part := range splitFields(line) {
			m := structField.FindStringSubmatch(part)
			if m == nil {
				return nil, fmt.Errorf("struct %s: cannot read field %q", name, strings.TrimSpace(part))
			}
			fields = append(fields, wgslField{m[1], strings.ReplaceAll(m[2], " ", "")})
		}
	}
	return fields, nil
}

// splitFields splits a line of a struct into its fields ("a: u32, b: f32"),
// keeping the commas inside array<…>.
func splitFields(line string) []string {
	if i := strings.Index(line, "//"); i >= 0 {
		line = line[:i]
	}
	var parts []string
	depth, from := 0, 0
	for i, r := range line {
		switch r {
		case '<':
			depth++
		case '>':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, line[from:i])
				from = i + 1
			}
		}
	}
	if strings.TrimSpace(line[from:]) != "" {
		parts = append(parts, line[from:])
	}
	return parts
}

// goType is the Go type a WGSL field type is mirrored by.
func goType(wgsl string) string {
	if m := wgslArray.FindStringSubmatch(wgsl); m != nil {
		n, _ := strconv.Atoi(m[3])
		if m[2] != "" { // a uniform array's elements are 16 bytes apart: vec4s
			return fmt.Sprintf("[%d]%s", 4*n, goType(m[2]))
		}
		return fmt.Sprintf("[%d]%s", n, goType(m[1]))
	}
	switch wgsl {
	case "u32":
		return "uint32"
	case "f32":
		return "float32"
	}
	return "(no Go twin for " + wgsl + ")"
}
