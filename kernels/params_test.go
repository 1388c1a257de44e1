package kernels

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"webdraft/gpu"
)

// kernelsOf are the package's kernels, for the tests that go through each.
var kernelsOf = map[string]gpu.Kernel{
	"rowTileInt4": rowTileInt4, "rowTileF16": rowTileF16, "rowTileF32": rowTileF32,
	"matVecInt4": matVecInt4, "matVecBatchInt4": matVecBatchInt4, "skinnyInt4": skinnyInt4, "gemmInt4": gemmInt4,
	"matMulReduce": matMulReduce, "embedInt4": embedInt4, "embedF16": embedF16, "embedF32": embedF32,
	"rmsNorm": rmsNorm, "rmsNormGathered": rmsNormGathered, "rmsNormPair": rmsNormPair, "rmsNormPairEmbed": rmsNormPairEmbed, "copyKernel": copyKernel, "advanceRowsKernel": advanceRowsKernel, "specAcceptKernel": specAcceptKernel, "specRowsKernel": specRowsKernel, "specDraftRowsKernel": specDraftRowsKernel, "specKeysKernel": specKeysKernel, "gatherKernel": gatherKernel, "gatherTwoKernel": gatherTwoKernel, "treeExpandKernel": treeExpandKernel, "treeSelectKernel": treeSelectKernel, "scatterKernel": scatterKernel, "argmaxPartial": argmaxPartial, "argmaxMerge": argmaxMerge, "samplePartial": samplePartial, "sampleMerge": sampleMerge,
	"attnDecode": attnDecode, "attnMerge": attnMerge, "attnPrefill": attnPrefill, "qkvRopeKV": qkvRopeKV, "qkvFused": qkvFused, "kvMove": kvMove, "kvMoveRows": kvMoveRows,
}

// TestParamsMatchWGSL: every kernel's Go params struct has the fields of
// the WGSL struct it fills, in order, by name and type — so that a field
// added, moved or retyped on one side fails here, not as wrong numbers on a
// GPU. The list above must name every gpu.Kernel of the package.
func TestParamsMatchWGSL(t *testing.T) {
	declared := kernelVars(t)
	for _, name := range declared {
		if _, ok := kernelsOf[name]; !ok {
			t.Errorf("kernel %s is not in kernelsOf", name)
		}
	}
	if len(declared) != len(kernelsOf) {
		t.Errorf("%d kernels declared, %d listed", len(declared), len(kernelsOf))
	}
	for name, k := range kernelsOf {
		if k.Params == nil {
			t.Errorf("%s has no params type", name)
		}
		if err := gpu.CheckParams(k); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// kernelVars returns the names of the package-level variables of type
// gpu.Kernel in the package's non-test files.
func kernelVars(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.VAR {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, v := range vs.Values {
					if lit, ok := v.(*ast.CompositeLit); ok {
						if sel, ok := lit.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Kernel" {
							names = append(names, vs.Names[i].Name)
						}
					}
				}
			}
		}
	}
	return names
}
