#!/usr/bin/env bash
# Packs what lab/dawn's runs need on the GPU machine, which has no Go and
# no Node, into .gpu/ (git-ignored), in sets that travel in separate device
# calls: the tree (39 MiB) with Node (21 MiB as xz) leaves no room under a
# call's 64 MiB for the rest, and what a call unpacks stays on the machine
# while it is held.
#
#   bash lab/dawn/pack.sh dawn        .gpu/dawn/: node.xz (this machine's Node,
#                                     stripped), dawn.node.xz (npm webgpu@0.6.2)
#   bash lab/dawn/pack.sh run [REV]   .gpu/run/: drafter.wasm, wasm_exec.js,
#                                     webdraft (native, no embedded pair),
#                                     prompts.jsonl (held-out ids with their
#                                     text); .gpu/tests/: the kernels', engine's
#                                     and gpu's tests as wasm; .gpu/prof/:
#                                     drafter.wasm with its function names;
#                                     built from REV (default HEAD) in a clean
#                                     worktree, so others' uncommitted edits stay out
#   bash lab/dawn/pack.sh base REV    .gpu/run/base/: drafter.wasm and
#                                     wasm_exec.js built from REV, which h200.sh
#                                     runs beside the build in .gpu/run (an A/B
#                                     in one call)
#
# On the machine, lab/dawn/h200.sh unpacks them (README.md).
set -euo pipefail
what=${1:?usage: pack.sh dawn | run [REV] | base REV}
root=$(git rev-parse --show-toplevel)
pack() { xz -T0 --x86 --lzma2=preset=9e,dict=64MiB -c "$1" > "$2"; }

case $what in
dawn)
  out=$root/.gpu/dawn
  mkdir -p "$out"
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  node=$(command -v node) || { echo "pack.sh: no node on PATH (Node 20, self-contained: glibc only)" >&2; exit 1; }
  strip -o "$scratch/node" "$node"
  pack "$scratch/node" "$out/node.xz"
  (cd "$scratch" && npm pack --silent webgpu@0.6.2 > /dev/null && tar xzf webgpu-0.6.2.tgz package/dist/linux-x64/dawn.node)
  xz -T0 -9e -c "$scratch/package/dist/linux-x64/dawn.node" > "$out/dawn.node.xz"
  echo "$("$node" --version) from $node; dawn.node from webgpu@0.6.2"
  ;;
run | base)
  rev=${2:-HEAD}
  [ "$what" = base ] && rev=${2:?usage: pack.sh base REV}
  out=$root/.gpu/run
  [ "$what" = base ] && out=$root/.gpu/run/base
  rm -rf "$out"
  mkdir -p "$out"
  src=$(mktemp -d)
  git -C "$root" worktree add -q --detach "$src" "$rev"
  trap 'git -C "$root" worktree remove --force "$src"' EXIT
  cd "$src"
  GOOS=js GOARCH=wasm go build -trimpath -ldflags=-s -o "$out/drafter.wasm" ./wasm
  xz -T0 -9 "$out/drafter.wasm"
  cp "$(go env GOROOT)/lib/wasm/wasm_exec.js" "$out/"
  git rev-parse HEAD > "$out/REVISION"
  if [ "$what" = run ]; then
    # The same program with its function names (the page's is stripped), for
    # h200.sh's PROFILE=1.
    prof=$root/.gpu/prof
    rm -rf "$prof" && mkdir -p "$prof"
    GOOS=js GOARCH=wasm go build -trimpath -o "$prof/drafter.wasm" ./wasm
    xz -T0 -9 "$prof/drafter.wasm"
    cp "$out/wasm_exec.js" "$prof/"
    bin=$(mktemp)
    GOEXPERIMENT=simd go build -tags webdraft_noembed -ldflags='-s -w' -o "$bin" ./cmd/webdraft
    # The held-out prompts with their text: the page sends text, and native
    # bench spec then tokenizes the same text.
    head -n 8 weights/heldout_prompts.jsonl | while read -r line; do
      ids=$(printf '%s' "$line" | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')
      "$bin" detokenize --ids "$ids" | python3 -c 'import json,sys; ids=[int(x) for x in sys.argv[1].split(",")]; print(json.dumps({"ids": ids, "text": json.load(sys.stdin)["text"]}))' "$ids"
    done > "$out/prompts.jsonl"
    pack "$bin" "$out/webdraft.xz"
    tests=$root/.gpu/tests
    rm -rf "$tests" && mkdir -p "$tests"
    for pkg in gpu kernels engine/webgpu; do
      # webdraft_noembed: the tests' binaries carry no pair (their shipped-pair
      # tests are skipped there; the harness checks the pair).
      GOOS=js GOARCH=wasm go test -c -tags webdraft_noembed -ldflags=-s -o "$bin" "./$pkg"
      xz -T0 -9 -c "$bin" > "$tests/$(basename "$pkg").test.wasm.xz"
    done
    cp "$out/REVISION" "$out/wasm_exec.js" "$tests/"
    rm -f "$bin"
    du -sh "$prof"/* "$tests"/*
  fi
  echo "built $(cat "$out/REVISION") into $out"
  ;;
*)
  echo "pack.sh: $what: want dawn or run" >&2
  exit 2
  ;;
esac
du -sh "$out"/*
