#!/usr/bin/env bash
# Real model sizes against the CUDA int4 peer, in one run on the GPU
# machine: for each published Qwen3 shape, `webdraft bench engine` with
# random int4 weights (batch-1 and batch-16 decode steps, verifications of
# 1–17 rows of one sequence (ROWS, 2,3,5,9,17), the matvecs at the shape, the step floor;
# with PROFILE=1 each kernel's GPU time), then lab/h200/int4_peer.py —
# torch's tinygemm int4 + a CUDA graph, eager and torch.compile'd — at the same
# shapes, so every ratio comes from one run on one machine. With BASE=other
# webdraft binaries (a comma-separated list), their bench engine runs
# first at each shape (an A/B of a change in the same run). With
# KERNELS=a kernels.test binary (`go test -c ./kernels`), also
# BenchmarkMatMulKernels at each shape (KBENCH picks its sub-benchmarks,
# KTS the activation rows), every kernel and layout over cold weights.
#
#   bash lab/h200/h200_setup.sh && WEBDRAFT=.gpu/webdraft OUT=$OUT [BASE=.gpu/wbase] \
#     [SHAPES=qwen3-8b,qwen3-1.7b] [PEER_SHAPES=…] [PROFILE=1] [PEER_ARGS=--matmuls] \
#     [KERNELS=.gpu/kernels.test [KBENCH=regexp] [KTS=1,17] [KSHAPES=qwen3-8b]] bash lab/h200/h200_shapes.sh
#
# Everything lands in one folder, packed into $OUT/results.tgz; the main
# figures are printed, and lab/h200/cost_model.py turns the folder into
# the cost model's tables (with SHAPES and PEER_SHAPES holding the target
# and its drafters; ENGINE_ARGS=--head adds an EAGLE-3 head's). PEER=0 leaves the peer out. The peer runs first (PEER_TIMEOUT seconds at most;
# each torch.compile'd figure takes about a minute to compile).
set -u
W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary}
OUT=${OUT:?set OUT to a results folder}
SHAPES=${SHAPES:-qwen3-8b,qwen3-1.7b}
R=$(mktemp -d)
trap 'tar czf "$OUT/results.tgz" -C "$R" .' EXIT
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv,noheader
if [ "${PEER:-1}" = 1 ]; then
echo "== the CUDA int4 peer"
# shellcheck disable=SC2086 # PEER_ARGS is a list of flags
timeout "${PEER_TIMEOUT:-360}" python3 lab/h200/int4_peer.py --shapes "${PEER_SHAPES:-$SHAPES}" --context 1024 --batches 1,16 --rows "${ROWS:-2,3,5,9,17}" \
  ${PEER_ARGS:-} 2>&1 | tee "$R/peer.txt" | grep -v '^#' || true
grep '^#' "$R/peer.txt"
fi
for s in ${SHAPES//,/ }; do
  profile=""
  [ "${PROFILE:-0}" = 1 ] && profile=--profile
  base=${BASE:-}
  for b in ${base//,/ } "$W"; do
    name=engine-$s.txt
    [ "$b" = "$W" ] || name=engine-base-$(basename "$b")-$s.txt
    echo "== $b $s"
    # shellcheck disable=SC2086 # profile and ENGINE_ARGS are lists of flags
    timeout 300 "$b" bench engine --shape "$s" --context 1024 --batches 1,16 --rows "1,${ROWS:-2,3,5,9,17}" --steps 16 \
      --prefill 256 --copy-mb 256 $profile ${ENGINE_ARGS:-} 2>&1 | grep -v '^time=' > "$R/$name"
    grep -E 'decode step|chained|verification|floor|EAGLE' "$R/$name"
  done
  if [ -n "$profile" ]; then sed -n '/GPU time/,$p' "$R/engine-$s.txt"; fi
  if [ -n "${KERNELS:-}" ] && [[ ",${KSHAPES:-$SHAPES}," == *",$s,"* ]]; then
    timeout 300 "$KERNELS" -test.run '^$' -test.bench "${KBENCH:-MatMulKernels}" -test.benchtime 50x \
      -benchshape "$s" -benchts "${KTS:-1,17}" -cold > "$R/kbench-$s.txt" 2>&1
    echo "kernels $s: $(grep -c '^Benchmark' "$R/kbench-$s.txt") benchmarks"
  fi
done
# The cost model, where the run holds a target and a drafter (COST_TARGET,
# COST_DRAFTERS: qwen3-8b with qwen3-0.6b and qwen3-1.7b).
ct=${COST_TARGET:-qwen3-8b}
if [ -e "$R/engine-$ct.txt" ]; then
  python3 lab/h200/cost_model.py "$R" --target "$ct" --drafters "${COST_DRAFTERS:-qwen3-0.6b,qwen3-1.7b}" \
    > "$R/cost-model.md" 2>&1 && cat "$R/cost-model.md"
fi
