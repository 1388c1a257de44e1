#!/usr/bin/env bash
# The performance issue's measurements on the GPU machine, in one run: a
# random HF-built Qwen3-1.7B converted to int4; the WebGPU engine's greedy
# drafts against the CPU reference's; `webdraft bench engine` with the batch
# plot and the per-kernel profile; the server under load at concurrency 1
# and 32 (10 turns a conversation, ~1k-token contexts; timed on contexts
# already cached, and at 32 also cold). Unless QUICK=1 (a
# kernel change's check, about 4 minutes), also Hugging Face transformers on
# the same checkpoint (eager, then static cache + torch.compile) and the
# server without steps chained on the GPU (about 12 minutes in all: more
# than one 10-minute device call, so run those parts on their own).
# Results land in OUT.
#
#   WEBDRAFT=.gpu/webdraft OUT=$OUT [QUICK=1] bash scripts/h200_perf.sh
set -u
W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary}
OUT=${OUT:?set OUT to a results folder}
QUICK=${QUICK:-0}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python3 scripts/random_hf_checkpoint.py --shape qwen3-1.7b --out /tmp/q17hf > "$OUT/ckpt.txt" 2>&1 || { cat "$OUT/ckpt.txt"; exit 1; }
"$W" convert --in /tmp/q17hf --out /tmp/q17 --quant int4 2>&1 | tail -1
for ids in 785,3974,13876 1,2,3,4,5,6,7,8,9,10; do
  a=$("$W" draft --model /tmp/q17 --ids "$ids" --n 16 --backend webgpu 2>>"$OUT/e2e.err")
  b=$(timeout 100 "$W" draft --model /tmp/q17 --ids "$ids" --n 16 --backend cpu 2>>"$OUT/e2e.err")
  echo "draft $ids: webgpu $a cpu $b $([ "$a" = "$b" ] && echo SAME || echo DIFFERENT)"
done | tee "$OUT/e2e.txt"
"$W" bench engine --model /tmp/q17 --context 1024 --batches 1,2,4,8,16,32,64 --steps 32 --prefill 1024 \
  --svg "$OUT/steps.svg" 2>&1 | grep -v '^time=' | tee "$OUT/engine.txt"
"$W" bench engine --model /tmp/q17 --context 1024 --batches 1,32 --steps 4 --prefill 64 --copy-mb 256 --profile 2>&1 |
  sed -n '/GPU time/,$p' | tee "$OUT/profile.txt"
[ "$QUICK" = 1 ] || timeout 300 python3 scripts/hf_draft_bench.py --model /tmp/q17hf --context 1024 --batches 1,32 2>&1 | grep '^{' | tee "$OUT/hf.txt"
chains="8 1"
[ "$QUICK" = 1 ] && chains=8
for chain in $chains; do
  "$W" serve --model /tmp/q17 --cache-mb 20000 --chain-steps $chain --addr 127.0.0.1:8080 > "$OUT/serve-$chain.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/health')" 2>/dev/null && break; sleep 0.5; done
  # --warm: the issue's figures, /draft on ~1k-token contexts already
  # cached; then concurrency 32 cold, new conversations' prefills included.
  for run in "1 --warm" "32 --warm" "32"; do
    set -- $run
    echo "chain-steps $chain, concurrency $*:"
    timeout 120 "$W" loadtest --concurrency $1 --conversations $(($1 == 1 ? 8 : 64)) --turns 10 --min-prompt 1000 --max-prompt 1024 ${2:-} 2>&1 |
      tee "$OUT/load-chain$chain-c$1${2:-}.txt"
  done
  kill $pid; wait $pid
done
