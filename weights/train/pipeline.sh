#!/usr/bin/env bash
# The whole recipe on the GPU machine, stage by stage, each under a time
# budget. WEBDRAFT is a webdraft binary built for that machine. SMOKE=1 runs
# every stage for a few steps only (checks the plumbing in ~3 minutes).
#
#   WEBDRAFT=.gpu/webdraft OUT=/tmp/pair bash weights/train/pipeline.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary}
OUT=${OUT:-/tmp/pair}
D=$OUT/data
mkdir -p "$OUT"
smoke=()
files=()
n=65536
if [ "${SMOKE:-0}" = 1 ]; then
  smoke=(--max-steps 30 --batch 8 --seq 128)
  files=(--max-files 400)
  n=512
fi
py() { python3 "$here/$1" "${@:2}"; }

py prepare_data.py --out "$D" "${files[@]}"
py train.py --role target --stage raw --data "$D" --out "$OUT/target-hf" --minutes "${TARGET_MINUTES:-7}" "${smoke[@]}"
"$W" convert --in "$OUT/target-hf" --out "$OUT/target" --quant int4
py distill_data.py --target "$OUT/target" --data "$D" --n "$n" --minutes "${DISTILL_MINUTES:-3}"
py train.py --role drafter --stage raw --data "$D" --out "$OUT/drafter-raw-hf" --minutes "${DRAFTER_MINUTES:-3}" "${smoke[@]}"
py train.py --role drafter --stage distill --data "$D" --init "$OUT/drafter-raw-hf" --out "$OUT/drafter-distill-hf" --minutes "${DRAFTER_MINUTES:-3}" "${smoke[@]}"
py train.py --role drafter --stage qat --data "$D" --init "$OUT/drafter-distill-hf" --out "$OUT/drafter-qat-hf" --minutes "${QAT_MINUTES:-2}" "${smoke[@]}"
# The table's four drafters: (1) raw text only and (2) distilled, unquantized;
# (3) distilled + QAT and (4) distilled + plain rounding, in int4.
"$W" convert --in "$OUT/drafter-raw-hf" --out "$OUT/1-raw" --quant f32
"$W" convert --in "$OUT/drafter-distill-hf" --out "$OUT/2-distilled" --quant f32
"$W" convert --in "$OUT/drafter-qat-hf" --out "$OUT/3-distilled-qat-int4" --quant int4
"$W" convert --in "$OUT/drafter-distill-hf" --out "$OUT/4-distilled-int4" --quant int4
prompts=(--prompts "$D/heldout_prompts.jsonl")
[ "${SMOKE:-0}" = 1 ] && prompts+=(--max-prompts 8)
for d in 1-raw 2-distilled 3-distilled-qat-int4 4-distilled-int4; do
  "$W" bench spec --target "$OUT/target" --drafter "$OUT/$d" "${prompts[@]}" --k 16 --new-tokens 128 --backend webgpu --svg "$OUT/hist-$d.svg"
done
