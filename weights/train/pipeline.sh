#!/usr/bin/env bash
# The whole recipe on the GPU machine in two phases, each within one of its
# 10-minute runs; the models of a phase train side by side, one per GPU when
# there are two (both on one GPU otherwise). WEBDRAFT is a webdraft binary
# built for that machine; OUT keeps the work between the phases.
#
#   phase 1: corpus; target and raw-text drafter side by side; the int4
#            target; its greedy continuations (distillation set), two shards
#   phase 2: the drafter distilled two ways side by side — cross-entropy on
#            the continuations (a), and that plus KL from the target's
#            distribution (b) —, each then int4 QAT; the table's drafters
#            converted
#   bench:   `webdraft bench spec` of every drafter on the held-out prompts, k = 16
#
#   WEBDRAFT=.gpu/webdraft OUT=/tmp/pair bash weights/train/pipeline.sh 1
#   WEBDRAFT=.gpu/webdraft OUT=/tmp/pair bash weights/train/pipeline.sh 2
#   WEBDRAFT=.gpu/webdraft OUT=/tmp/pair bash weights/train/pipeline.sh bench
#
# SMOKE=1 runs every stage for a few steps only (checks the plumbing).
# Budgets in minutes: PHASE1_MINUTES (9.2: what the target and raw drafter
# get is what data preparation leaves), DISTILL_GEN_MINUTES (1.8),
# DISTILL_MINUTES (3.2), QAT_MINUTES (1.3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary}
OUT=${OUT:-/tmp/pair}
D=$OUT/data
L=$OUT/logs
mkdir -p "$OUT" "$L"
export PYTHONUNBUFFERED=1
smoke=()
files=()
if [ "${SMOKE:-0}" = 1 ]; then
  smoke=(--max-steps 30 --batch 8 --seq 128)
  files=(--max-files 400)
fi
ngpu=$(python3 -c 'import torch; print(max(1, torch.cuda.device_count()))')

py() { python3 "$here/$1" "${@:2}"; }
# on GPU LOG CMD...: runs a stage in the background on GPU (mod the count).
on() {
  local gpu=$(($1 % ngpu)) log=$L/$2.log
  shift 2
  echo "[$(date +%T)] start $(basename "$log" .log) on GPU $gpu"
  CUDA_VISIBLE_DEVICES=$gpu "$@" >"$log" 2>&1 &
}
# waitall: waits for the background stages; fails if one did.
waitall() {
  local fail=0
  for p in $(jobs -p); do wait "$p" || fail=1; done
  tail -n 2 "$L"/*.log
  [ $fail = 0 ] || { echo "a stage failed; logs in $L" >&2; exit 1; }
}

phase1() {
  local start=$SECONDS
  py prepare_data.py --out "$D" "${files[@]}" | tee "$L/prepare.log"
  local left minutes
  left=$(python3 -c "print(${PHASE1_MINUTES:-9.2} - ($SECONDS - $start) / 60)")
  minutes=$(python3 -c "print(round($left - ${DISTILL_GEN_MINUTES:-1.8} - 0.5, 2))")
  echo "training the target and the raw drafter for $minutes minutes"
  on 0 target py train.py --role target --stage raw --data "$D" --out "$OUT/target-hf" --minutes "$minutes" "${smoke[@]}"
  on 1 drafter-raw py train.py --role drafter --stage raw --data "$D" --out "$OUT/drafter-raw-hf" --minutes "$minutes" "${smoke[@]}"
  waitall
  "$W" convert --in "$OUT/target-hf" --out "$OUT/target" --quant int4
  local n=1048576
  [ "${SMOKE:-0}" = 1 ] && n=4096
  for s in 0 1; do
    on $s distill-gen-$s py distill_data.py --target "$OUT/target" --data "$D" --shard $s --n $n --new 96 \
      --minutes "${DISTILL_GEN_MINUTES:-1.8}"
  done
  waitall
}

phase2() {
  local m=${DISTILL_MINUTES:-3.2} q=${QAT_MINUTES:-1.3}
  distill() { # NAME KL
    py train.py --role drafter --stage distill --data "$D" --init "$OUT/drafter-raw-hf" --out "$OUT/drafter-$1-hf" \
      --kl "$2" --target "$OUT/target" --minutes "$m" "${smoke[@]}" &&
      py train.py --role drafter --stage qat --data "$D" --init "$OUT/drafter-$1-hf" --out "$OUT/drafter-$1-qat-hf" \
        --kl "$2" --target "$OUT/target" --minutes "$q" "${smoke[@]}"
  }
  on 0 distill-a distill a 0
  on 1 distill-b distill b 1
  waitall
  # The table's drafters: (1) raw text only and (2) distilled, unquantized;
  # (3) distilled + QAT and (4) distilled + plain rounding, in int4.
  "$W" convert --in "$OUT/drafter-raw-hf" --out "$OUT/1-raw" --quant f32
  for v in a b; do
    "$W" convert --in "$OUT/drafter-$v-hf" --out "$OUT/2$v-distilled" --quant f32
    "$W" convert --in "$OUT/drafter-$v-qat-hf" --out "$OUT/3$v-distilled-qat-int4" --quant int4
    "$W" convert --in "$OUT/drafter-$v-hf" --out "$OUT/4$v-distilled-int4" --quant int4
  done
}

bench() {
  local prompts=(--prompts "$D/heldout_prompts.jsonl")
  [ "${SMOKE:-0}" = 1 ] && prompts+=(--max-prompts 8)
  mkdir -p "$OUT/bench"
  for d in 1-raw 2a-distilled 2b-distilled 3a-distilled-qat-int4 3b-distilled-qat-int4 4a-distilled-int4 4b-distilled-int4; do
    "$W" bench spec --target "$OUT/target" --drafter "$OUT/$d" "${prompts[@]}" --k 16 --new-tokens 128 \
      --backend webgpu --svg "$OUT/bench/$d.svg" >"$OUT/bench/$d.txt" 2>"$L/bench-$d.log" &
  done
  local fail=0
  for p in $(jobs -p); do wait "$p" || fail=1; done
  grep -H "τ" "$OUT"/bench/*.txt
  [ $fail = 0 ] || { echo "a bench failed; logs in $L" >&2; exit 1; }
}

case "${1:-}" in
1) phase1 ;;
2) phase2 ;;
bench) bench ;;
all) phase1; phase2; bench ;;
*) echo "usage: pipeline.sh 1|2|bench|all" >&2; exit 2 ;;
esac
