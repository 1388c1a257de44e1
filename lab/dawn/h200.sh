#!/usr/bin/env bash
# The GPU machine's runs of lab/dawn (the device tool's `run`, in the
# checkout's copy there; README.md). Calls back to back, while the machine
# stays held:
#
#   bash lab/dawn/h200.sh dawn     carry .gl and .gpu/dawn/node.xz, then
#                                  .gpu/dawn/dawn.node.xz (with the next
#                                  call's set, if it fits): unpacks them in
#                                  .gpu/dawn/ (they stay there), then prints
#                                  the adapter Dawn finds
#   bash lab/dawn/h200.sh run      carry .gl .gpu/run (and .gpu/tests for the
#                                  tests, .gpu/prof for PROFILE=1):
#                                  correctness and figures, through Dawn and
#                                  natively, into $OUT
#
# PROMPTS (default 8), TOKENS (128), KS (4,6) size the race; EDGE=0 skips
# edge mode from a cold cache; FIGURES=0 skips the figures (the tests
# alone); TESTPKGS lists the tests' packages as DIR:BINARY:SECONDS (default:
# gpu, kernels, engine/webgpu); TESTS=0 skips the tests' wasm binaries
# (which run where .gpu/tests is); PROFILE=1 runs the engine's build with
# its function names (.gpu/prof) and writes Node's CPU profiles of the
# engine's timed steps and of the race ($OUT/steps-*.cpuprofile:
# lab/dawn/cpuprofile.py reads them); where .gpu/run/base holds another
# build (pack.sh base REV), the engine and the race run with it too, after
# this build's, for an A/B in one call;
# CALLS=1 times the engine's WebGPU calls and replays a step's from
# JavaScript alone (harness.cjs --calls); SHAPE=qwen3-0.6b adds a drafter
# of that published shape with random int4 weights (webdraft bench convert),
# natively and through Dawn; KPLAN=PATTERN runs the kernels' benchmarks of
# that -test.bench pattern through Dawn at the pair's shapes (.gpu/tests),
# KPLAN_ARGS more flags for them (default -benchts=1,4 -test.benchtime 200x).
set -uo pipefail
what=${1:?usage: h200.sh dawn | run}
: "${OUT:?OUT: the folder for the results}"
for f in .gl/*.deb; do dpkg -x "$f" / > /dev/null; done
ldconfig
# The machine has python3 but no xz.
unxz() { python3 -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.open(sys.argv[1]).read())" "$1" "$2"; }
root=$PWD
node=$root/.gpu/dawn/node
export DAWN_NODE=$root/.gpu/dawn/dawn.node

case $what in
dawn)
  # Either file or both: with the tree, one at a time fits a call.
  set -e
  if [ -e .gpu/dawn/node.xz ]; then
    unxz .gpu/dawn/node.xz "$node" && chmod +x "$node" && rm .gpu/dawn/node.xz
  fi
  if [ -e .gpu/dawn/dawn.node.xz ]; then
    unxz .gpu/dawn/dawn.node.xz "$DAWN_NODE" && rm .gpu/dawn/dawn.node.xz
  fi
  if [ -x "$node" ] && [ -e "$DAWN_NODE" ]; then
    "$node" --version
    "$node" lab/dawn/harness.cjs adapter --out "$OUT/adapter.json"
  else
    echo "h200.sh: unpacked $(ls .gpu/dawn); carry the other file next"
  fi
  ;;
run)
  if [ ! -x "$node" ] || [ ! -e "$DAWN_NODE" ]; then
    echo "h200.sh: no $node or $DAWN_NODE here: run \`h200.sh dawn\` first, on this same machine (a fresh one starts bare)" >&2
    exit 1
  fi
  run=.gpu/run
  for f in .gpu/run/*.xz .gpu/run/*/*.xz .gpu/tests/*.xz .gpu/prof/*.xz; do
    [ -e "$f" ] && unxz "$f" "${f%.xz}" && rm "$f"
  done
  [ -e "$run/webdraft" ] && chmod +x "$run/webdraft"
  prompts=${PROMPTS:-8} tokens=${TOKENS:-128} ks=${KS:-4,6}
  # harness SECONDS MODE [options]: lab/dawn/harness.cjs on the pair, its
  # drafts checked against native webdraft's.
  wasm=$run profile=()
  if [ "${PROFILE:-0}" != 0 ]; then
    wasm=.gpu/prof profile=(--profile "$OUT/steps")
  fi
  harness() {
    local secs=$1 mode=$2
    shift 2
    timeout "$secs" "$node" lab/dawn/harness.cjs "$mode" --wasm "$wasm" --prompts "$run/prompts.jsonl" \
      --max-prompts "$prompts" --native "$run/webdraft" "$@"
    local rc=$?
    [ $rc = 124 ] && echo "h200.sh: harness $mode: stopped after $secs s"
    return $rc
  }
  [ "${FIGURES:-1}" != 0 ] && {
    echo "revision $(cat "$run/REVISION"); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    echo "== native (wgpu-native, Vulkan): the pair's steps"
    for m in drafter target; do
      timeout 60 "$run/webdraft" bench engine --backend webgpu --model "weights/$m" --context 128 --batches 1 --steps 64 \
        --prefill 64 --copy-mb 256 2>&1 | grep -E "^(adapter|model|decode step|  chained|batch-1 step floor|reproduce)"
    done
    echo "== native: mode (a)'s loop (bench spec --live), the same prompts"
    timeout 120 "$run/webdraft" bench spec --live --backend webgpu --target weights/target --drafter weights/drafter \
      --prompts "$run/prompts.jsonl" --max-prompts "$prompts" --new-tokens "$tokens" --batch 1 --ks "$ks" 2>&1 | grep -v "level=INFO"
    calls=()
    [ "${CALLS:-0}" != 0 ] && calls=(--calls)
    echo "== Dawn: the engine alone (drafts against native webdraft's, steps)"
    harness 120 engine --n 16 --steps 64 --chain 16 --rounds 16 "${calls[@]}" "${profile[@]}" --out "$OUT/engine.json"
    if [ -n "${SHAPE:-}" ]; then
      echo "== a drafter of $SHAPE's shape, random int4 weights: natively and through Dawn"
      scratch=$(mktemp -d)
      timeout 240 "$run/webdraft" bench convert --shape "$SHAPE" --scratch "$scratch" 2>&1 | grep -v "level=INFO"
      shaped=$scratch/$SHAPE
      mv "$scratch/out-int4" "$shaped" && rm -rf "$scratch/hf"
      timeout 60 "$run/webdraft" bench engine --backend webgpu --model "$shaped" --context 128 --batches 1 --steps 64 \
        --prefill 64 2>&1 | grep -E "^(adapter|model|decode step|  chained|batch-1 step floor)"
      harness 180 engine --drafter "$shaped" --n 16 --steps 64 --chain 16 --rounds 16 "${calls[@]}" --out "$OUT/engine-$SHAPE.json"
    fi
    echo "== Dawn: the page's worker, mode (a): the race"
    harness 180 browser --k "$ks" --max-tokens "$tokens" "${profile[@]}" --out "$OUT/browser.json"
    if [ -d "$run/base" ]; then
      wasm=$run/base
      echo "== Dawn, the base build $(cat "$run/base/REVISION"): the engine alone"
      harness 120 engine --n 16 --steps 64 --chain 16 --rounds 16 --out "$OUT/engine-base.json"
      echo "== Dawn, the base build: the race"
      harness 180 browser --k "$ks" --max-tokens "$tokens" --out "$OUT/browser-base.json"
      wasm=$run
      echo "== Dawn, this build again: the race"
      harness 180 browser --k "$ks" --max-tokens "$tokens" --out "$OUT/browser-again.json"
    fi
    if [ "${EDGE:-1}" != 0 ]; then
      echo "== Dawn: the page's worker, edge, from a cold cache over loopback HTTP"
      harness 60 edge --cold --n 16 --out "$OUT/edge.json"
    fi
  } 2>&1 | grep -v XDG_RUNTIME_DIR | tee "$OUT/figures.txt"
  if [ -n "${KPLAN:-}" ]; then
    export WASM_EXEC=$root/.gpu/tests/wasm_exec.js
    echo "== the kernels' benchmarks through Dawn, at the pair's shapes: $KPLAN"
    # shellcheck disable=SC2086
    (cd kernels && timeout 300 "$node" "$root/lab/dawn/gotest.cjs" "$root/.gpu/tests/kernels.test.wasm" -test.run '^$' \
      -test.bench "$KPLAN" -benchshape=embedded ${KPLAN_ARGS:--benchts=1,4 -test.benchtime 200x} 2>&1) |
      grep -v XDG_RUNTIME_DIR | tee "$OUT/kplan.txt"
  fi
  if [ "${TESTS:-1}" != 0 ] && [ -d .gpu/tests ]; then
    export WASM_EXEC=$root/.gpu/tests/wasm_exec.js
    {
      echo "== the tests compiled to wasm, through Dawn"
      for t in ${TESTPKGS:-gpu:gpu:60 kernels:kernels:180 engine/webgpu:webgpu:100}; do
        IFS=: read -r dir bin secs <<< "$t"
        echo "-- $dir"
        # The shipped-pair tests need the embedded pair, which these
        # binaries lack (webdraft_noembed): the harness checks the pair.
        (cd "$dir" && timeout "$secs" "$node" "$root/lab/dawn/gotest.cjs" "$root/.gpu/tests/$bin.test.wasm" -test.v -test.count=1 \
          -test.timeout "$((secs - 5))s" -test.skip 'TestSmallBindings|TestShippedLogprobs' 2>&1 | grep -v -E "^=== (RUN|PAUSE|CONT)"
          echo "exit ${PIPESTATUS[0]}")
      done
    } 2>&1 | grep -v XDG_RUNTIME_DIR | tee "$OUT/tests.txt"
  fi
  ;;
*)
  echo "h200.sh: $what: want dawn or run" >&2
  exit 2
  ;;
esac
