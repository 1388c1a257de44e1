#!/usr/bin/env bash
# Measures webdraft binaries against each other in one run on the GPU
# machine, alternating them ROUNDS times: a change is judged against its
# base on the same machine at the same time (within a run the chained steps
# vary by ~1 %; between machines and runs by up to 10 %). Each turn is
# `webdraft bench engine ARGS`; the chained-step rows and gate|up's matvec
# are printed under the binary's name.
#
#   bash lab/h200/h200_setup.sh && BINS=".gpu/wA .gpu/wB" [ROUNDS=2] [ARGS=...] bash lab/h200/h200_ab.sh
set -u
BINS=${BINS:?set BINS to the webdraft binaries, space-separated}
ROUNDS=${ROUNDS:-2}
ARGS=${ARGS:---shape qwen3-1.7b --context 1024 --batches 1,2,4 --steps 64 --prefill 64 --copy-mb 64}
for r in $(seq 1 "$ROUNDS"); do
  for b in $BINS; do
    echo "== $b, round $r"
    # shellcheck disable=SC2086 # ARGS is a list of flags
    timeout 120 "$b" bench engine $ARGS 2>&1 | grep -E 'chained|matvec gate' || echo "$b: no result"
  done
done
