#!/usr/bin/env bash
# Measures webdraft binaries against each other in one run on the GPU
# machine, alternating them ROUNDS times: a change is judged against its
# base on the same machine at the same time (within a run the chained steps
# vary by ~1 %; between machines and runs by up to 10 %). Each turn is
# `webdraft bench engine ARGS`, whose chained-step, prefill and gate|up
# matvec rows are printed under the binary's name; with MODEL=a model
# folder, also that binary serving it under `webdraft loadtest` at
# concurrency 1 and 32 on ~1k-token contexts already cached (as
# h200_perf.sh), its summary rows printed.
#
#   bash lab/h200/h200_setup.sh && BINS=".gpu/wA .gpu/wB" [ROUNDS=2] [ARGS=...] [MODEL=/tmp/q17] bash lab/h200/h200_ab.sh
set -u
BINS=${BINS:?set BINS to the webdraft binaries, space-separated}
ROUNDS=${ROUNDS:-2}
ARGS=${ARGS:---shape qwen3-1.7b --context 1024 --batches 1,2,4 --steps 64 --prefill 64 --copy-mb 64}
serve() { # binary: /draft under load, as h200_perf.sh measures it
  "$1" serve --model "$MODEL" --cache-mb 20000 --addr 127.0.0.1:8080 > /tmp/ab-serve.log 2>&1 &
  local pid=$!
  for _ in $(seq 100); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/health')" 2>/dev/null && break; sleep 0.5; done
  for c in 1 32; do
    timeout 120 "$1" loadtest --concurrency $c --conversations $((c == 1 ? 8 : 64)) --turns 10 --min-prompt 1000 --max-prompt 1024 --warm 2>&1 |
      grep -v '^time=' | sed -n '1,2p' | sed "s/^/c$c /"
  done
  kill $pid; wait $pid
}
for r in $(seq 1 "$ROUNDS"); do
  for b in $BINS; do
    echo "== $b, round $r"
    # shellcheck disable=SC2086 # ARGS is a list of flags
    timeout 240 "$b" bench engine $ARGS 2>&1 | grep -E 'chained|prefill|matvec gate' || echo "$b: no result"
    if [ -n "${MODEL:-}" ]; then
      serve "$b"
    fi
  done
done
