#!/usr/bin/env bash
# The whole recipe on the GPU machine, in phases that each fit one of its
# 10-minute runs; stages that can overlap run side by side (one per GPU when
# there are several, sharing the one otherwise). WEBDRAFT is a webdraft
# binary built for that machine; OUT keeps the work of a phase.
#
#   target:  the corpus (the Python sources there and, from GO_SRC, the Go
#            toolchain's); the target from scratch; its int4 folder; the
#            quality figures of the old and the new target (quality.py)
#   target-more: another cycle of the target's training (see below)
#   target-ul: another cycle with sequence-level unlikelihood mixed in
#            (train.py --stage ul): against greedy loops (see below)
#   drafter: the corpus again (the same files: prepare_data.py is
#            deterministic) unless OUT has it; the drafter on raw text over
#            the int4 target's embedding, frozen, and beside it the target's
#            greedy continuations (the distillation set); the drafter
#            distilled on them, then int4 QAT; the table's drafters
#            converted against TARGET (the target's int4 folder)
#   bench:   `webdraft bench spec` of each of those drafters
#   live:    `webdraft bench spec --live` of the shipped pair (TARGET and
#            LIVE_DRAFTER), greedy and at temperature 0.7
#   eagle3:  the corpus and the distillation set unless OUT has them; an
#            EAGLE-3 head for TARGET (train_eagle3.py; see eagle3() below)
#   eagle3-live: the head live against the shipped drafter (eagle3_live())
#
#   WEBDRAFT=.gpu/webdraft GO_SRC=.gpu/gosrc.tar.xz OUT=/tmp/pair bash weights/train/pipeline.sh target
#   WEBDRAFT=.gpu/webdraft OUT=/tmp/pair bash weights/train/pipeline.sh target-more   # as often as time allows
#   WEBDRAFT=.gpu/webdraft GO_SRC=.gpu/gosrc.tar.xz TARGET=weights/target OUT=/tmp/pair bash weights/train/pipeline.sh target-ul
#   OUT=/tmp/pair bash weights/train/pipeline.sh export-target DEST   # what leaves the machine
#   (here: the target into weights/target; then, with that tree, on the machine again)
#   WEBDRAFT=.gpu/webdraft GO_SRC=.gpu/gosrc.tar.xz TARGET=weights/target OUT=/tmp/pair bash weights/train/pipeline.sh drafter
#   OUT=/tmp/pair bash weights/train/pipeline.sh export-drafter DEST
#
# The drafter leaves as Hugging Face folders without an embedding;
# `webdraft convert --embedding-from weights/target` makes the shipped one
# (weights/train/README.md). SMOKE=1 runs every stage for a few steps only
# (checks the plumbing). Budgets in minutes: TARGET_PHASE_MINUTES (9: the
# target gets what data preparation and its conversion leave), TARGET_MORE_MINUTES (8),
# TARGET_UL_PHASE_MINUTES (9: as TARGET_PHASE_MINUTES), UL_LR (1e-3),
# UL_WEIGHT (1), UL_N (10), RAW_MINUTES
# (2.4), DISTILL_GEN_MINUTES (1.6), DISTILL_MINUTES (2.2), QAT_MINUTES (0.9).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
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
prepare() {
  [ -e "$D/token_counts.npy" ] && return
  local go=()
  [ -n "${GO_SRC:-}" ] && go=(--go-src "$GO_SRC")
  py prepare_data.py --out "$D" "${files[@]}" "${go[@]}" | tee "$L/prepare.log"
}

target() {
  local W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary} start=$SECONDS minutes
  prepare
  minutes=$(python3 -c "print(round(${TARGET_PHASE_MINUTES:-9} - ($SECONDS - $start) / 60 - 0.8, 2))")
  echo "training the target for $minutes minutes"
  on 0 target py train.py --role target --stage raw --data "$D" --out "$OUT/target-hf" --minutes "$minutes" "${smoke[@]}"
  waitall
  "$W" convert --in "$OUT/target-hf" --out "$OUT/target" --quant int4
  on 0 quality py quality.py --data "$D" --model old=weights/target --model new="$OUT/target" --out "$OUT/quality.json"
  waitall
}

# target-more: one more warm-up and cosine cycle of the target, from
# OUT/target-hf when this machine made it, else from TARGET (an int4 folder,
# dequantized: a later session goes on from the tree's own target); then
# its int4 folder and the quality figures, as target does.
target_more() {
  local W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary} from=$OUT/target-hf cycle=${CYCLE:-2}
  [ -e "$from/config.json" ] || from=${TARGET:?no OUT/target-hf: set TARGET to the int4 target folder}
  prepare
  on 0 target-more py train.py --role target --stage raw --data "$D" --init "$from" --out "$OUT/target-hf-$cycle" \
    --seed "$cycle" --lr 1e-3 --warmup 100 --minutes "${TARGET_MORE_MINUTES:-8}" "${smoke[@]}"
  waitall
  rm -rf "$OUT/target-hf" && mv "$OUT/target-hf-$cycle" "$OUT/target-hf"
  "$W" convert --in "$OUT/target-hf" --out "$OUT/target" --quant int4
  on 0 quality py quality.py --data "$D" --model old=weights/target --model new="$OUT/target" --out "$OUT/quality.json"
  waitall
}

# target-ul: one more warm-up and cosine cycle of the target with
# sequence-level unlikelihood (train.py --stage ul: the raw-text loss plus
# -log(1 - p) of the tokens of its own greedy continuations that continue a
# copy of an earlier UL_N-gram), from OUT/target-hf or TARGET as
# target-more; then its int4 folder and the quality figures. The target's
# int4 parts are exported to EXPORT_TO (if set) before quality.py runs, so
# that they leave even if the phase runs out of time.
target_ul() {
  local W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary} from=$OUT/target-hf start=$SECONDS minutes
  [ -e "$from/config.json" ] || from=${TARGET:?no OUT/target-hf: set TARGET to the int4 target folder}
  local ul=(--ul-weight "${UL_WEIGHT:-1}" --ul-n "${UL_N:-10}")
  [ "${SMOKE:-0}" = 1 ] && ul+=(--ul-pool 64 --ul-batch 8 --ul-new 32)
  prepare
  minutes=$(python3 -c "print(round(${TARGET_UL_PHASE_MINUTES:-9} - ($SECONDS - $start) / 60 - 0.9, 2))")
  echo "training the target with unlikelihood for $minutes minutes"
  on 0 target-ul py train.py --role target --stage ul --data "$D" --init "$from" --out "$OUT/target-hf-ul" \
    --seed "${CYCLE:-3}" --lr "${UL_LR:-1e-3}" --warmup 100 --minutes "$minutes" "${ul[@]}" "${smoke[@]}"
  waitall
  rm -rf "$OUT/target-hf" && mv "$OUT/target-hf-ul" "$OUT/target-hf"
  "$W" convert --in "$OUT/target-hf" --out "$OUT/target" --quant int4
  if [ -n "${EXPORT_TO:-}" ]; then
    mkdir -p "$EXPORT_TO" && split -b 15M -d "$OUT/target/model.safetensors" "$EXPORT_TO/target.safetensors.part"
  fi
  on 0 quality py quality.py --data "$D" --model old=weights/target --model new="$OUT/target" --out "$OUT/quality.json"
  waitall
}

drafter() {
  local W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary} T=${TARGET:?set TARGET to the int4 target folder}
  local raw=${RAW_MINUTES:-2.4} m=${DISTILL_MINUTES:-2.2} q=${QAT_MINUTES:-0.9} n=1048576
  local frozen=(--embedding-from "$T")
  [ "${SMOKE:-0}" = 1 ] && n=4096
  prepare
  on 0 drafter-raw py train.py --role drafter --stage raw --data "$D" --out "$OUT/drafter-raw-hf" \
    --export "$OUT/export/raw" --minutes "$raw" "${frozen[@]}" "${smoke[@]}"
  on 1 distill-gen py distill_data.py --target "$T" --data "$D" --shard 0 --n $n --new 96 \
    --minutes "${DISTILL_GEN_MINUTES:-1.6}"
  waitall
  on 0 distill py train.py --role drafter --stage distill --data "$D" --init "$OUT/drafter-raw-hf" \
    --out "$OUT/drafter-distilled-hf" --export "$OUT/export/distilled" --minutes "$m" "${frozen[@]}" "${smoke[@]}"
  waitall
  on 0 qat py train.py --role drafter --stage qat --data "$D" --init "$OUT/drafter-distilled-hf" \
    --out "$OUT/drafter-qat-hf" --export "$OUT/export/qat" --minutes "$q" "${frozen[@]}" "${smoke[@]}"
  waitall
  convert_drafters "$W" "$T" "$OUT/export" "$OUT"
}

# convert_drafters WEBDRAFT TARGET EXPORTS DEST: the table's drafters from
# the exported ones — (1) raw text only and (2) distilled, f32 layers;
# (3) distilled + QAT and (4) distilled + plain rounding, int4 — each over
# TARGET's embedding, its head over the whole vocabulary.
convert_drafters() {
  local W=$1 T=$2 E=$3 dest=$4
  "$W" convert --in "$E/raw" --out "$dest/1-raw" --quant f32 --embedding-from "$T"
  "$W" convert --in "$E/distilled" --out "$dest/2-distilled" --quant f32 --embedding-from "$T"
  "$W" convert --in "$E/qat" --out "$dest/3-distilled-qat-int4" --quant int4 --embedding-from "$T"
  "$W" convert --in "$E/distilled" --out "$dest/4-distilled-int4" --quant int4 --embedding-from "$T"
}

bench() {
  local W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary} T=${TARGET:?set TARGET to the int4 target folder}
  local prompts=(--prompts "$D/heldout_prompts.jsonl")
  [ -e "$D/heldout_prompts.jsonl" ] || prompts=(--prompts weights/heldout_prompts.jsonl)
  [ "${SMOKE:-0}" = 1 ] && prompts+=(--max-prompts 8)
  mkdir -p "$OUT/bench"
  for d in 1-raw 2-distilled 3-distilled-qat-int4 4-distilled-int4; do
    "$W" bench spec --target "$T" --drafter "$OUT/$d" "${prompts[@]}" --k 16 --new-tokens 128 \
      --backend webgpu --svg "$OUT/bench/$d.svg" >"$OUT/bench/$d.txt" 2>"$L/bench-$d.log" &
  done
  local fail=0
  for p in $(jobs -p); do wait "$p" || fail=1; done
  grep -H "τ" "$OUT"/bench/*.txt
  [ $fail = 0 ] || { echo "a bench failed; logs in $L" >&2; exit 1; }
}

# live: the shipped pair's wall-clock speedup, `webdraft bench spec --live`
# of TARGET and LIVE_DRAFTER (default OUT/shipped: the QAT drafter with its
# head cut to 32,768 tokens, as weights/drafter) on LIVE_PROMPTS (24) of the
# held-out prompts: greedy at LIVE_KS (2,4,6,8,16), then at temperature 0.7
# at LIVE_KS_SAMPLED (4,6,8,16).
live() {
  local W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary} T=${TARGET:?set TARGET to the int4 target folder}
  local dr=${LIVE_DRAFTER:-$OUT/shipped} n=${LIVE_PROMPTS:-24}
  [ "${SMOKE:-0}" = 1 ] && n=2
  mkdir -p "$OUT/bench"
  local args=(bench spec --live --target "$T" --drafter "$dr" --prompts weights/heldout_prompts.jsonl
    --max-prompts "$n" --new-tokens 128 --batch 1 --backend webgpu)
  "$W" "${args[@]}" --ks "${LIVE_KS:-2,4,6,8,16}" >"$OUT/bench/live-greedy.txt" 2>"$L/live-greedy.log"
  cat "$OUT/bench/live-greedy.txt"
  "$W" "${args[@]}" --ks "${LIVE_KS_SAMPLED:-4,6,8,16}" --temperature 0.7 >"$OUT/bench/live-t07.txt" 2>"$L/live-t07.log"
  cat "$OUT/bench/live-t07.txt"
}

# export-target DEST / export-drafter DEST: what leaves the machine, in files
# of at most 15 MiB.
export_target() {
  local dest=${1:?export-target DEST}
  mkdir -p "$dest"
  split -b 15M -d "$OUT/target/model.safetensors" "$dest/target.safetensors.part"
  gzip -kf "$D/files.tsv"
  tar -czf "$dest/target-meta.tar.gz" -C "$OUT" target/config.json data/DATA_MANIFEST.md data/files.tsv.gz \
    data/heldout_prompts.jsonl quality.json logs
  ls -l "$dest"
}
export_drafter() {
  local dest=${1:?export-drafter DEST}
  mkdir -p "$dest"
  for v in raw distilled qat; do cp "$OUT/export/$v/model.safetensors" "$dest/drafter-$v.safetensors"; done
  tar -czf "$dest/drafter-meta.tar.gz" -C "$OUT" export/raw/config.json export/distilled/config.json \
    export/qat/config.json logs
  ls -l "$dest"
}

# eagle3: the corpus and the target's greedy continuations (the
# distillation set, as drafter makes it) unless OUT has them; then an
# EAGLE-3 head for TARGET trained on them for EAGLE3_MINUTES (5), its draft
# vocabulary the shipped drafter's (DRAFTER, weights/drafter), written as a
# webdraft int4 folder to OUT/head with its held-out figures (eval.json).
# EAGLE3_INIT goes on training a head folder (a later cycle: give it
# DISTILL_SHARD 1, 2 … for continuations of other prompts);
# EAGLE3_MAX_FILES caps the corpus's files (only prompts are drawn from it
# here); EAGLE3_DATA_ONLY=1 stops after the data; EAGLE3_ARGS are more of
# train_eagle3.py's flags (e.g. "--intermediate 4096 --aux 2,8,15").
eagle3() {
  local T=${TARGET:?set TARGET to the int4 target folder} n=1048576 es=()
  [ "${SMOKE:-0}" = 1 ] && { n=4096; es=(--max-steps 30 --batch 8); }
  [ -n "${EAGLE3_INIT:-}" ] && es+=(--init "$EAGLE3_INIT" --lr 6e-4 --warmup 50)
  [ -n "${EAGLE3_MAX_FILES:-}" ] && files=(--max-files "$EAGLE3_MAX_FILES")
  prepare
  if ! compgen -G "$D/distill-*.npy" >/dev/null; then
    on 0 distill-gen py distill_data.py --target "$T" --data "$D" --shard "${DISTILL_SHARD:-0}" --n $n --new 96 \
      --minutes "${DISTILL_GEN_MINUTES:-1.6}"
    waitall
  fi
  [ "${EAGLE3_DATA_ONLY:-0}" = 1 ] && return
  on 0 eagle3 py train_eagle3.py --target "$T" --drafter "${DRAFTER:-weights/drafter}" --data "$D" \
    --out "$OUT/head" --minutes "${EAGLE3_MINUTES:-5}" "${es[@]}" ${EAGLE3_ARGS:-}
  waitall
}

# eagle3-live: the head (HEAD, default OUT/head) live against the shipped
# drafter (DRAFTER, weights/drafter) over TARGET, `webdraft bench spec
# --live` on LIVE_PROMPTS (16) held-out prompts, greedy at LIVE_KS (3,4,6):
# the head with --unfused too (its chain and the verification in one
# submission, and as two calls), into OUT/bench/live-head.txt and
# live-drafter.txt.
eagle3_live() {
  local W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary} T=${TARGET:?set TARGET to the int4 target folder}
  local head=${HEAD:-$OUT/head} n=${LIVE_PROMPTS:-16}
  [ "${SMOKE:-0}" = 1 ] && n=2
  mkdir -p "$OUT/bench"
  local args=(bench spec --live --target "$T" --prompts weights/heldout_prompts.jsonl
    --max-prompts "$n" --new-tokens 128 --batch 1 --backend webgpu --ks "${LIVE_KS:-3,4,6}")
  "$W" "${args[@]}" --unfused --drafter "$head" >"$OUT/bench/live-head.txt" 2>"$L/live-head.log"
  cat "$OUT/bench/live-head.txt"
  "$W" "${args[@]}" --drafter "${DRAFTER:-weights/drafter}" >"$OUT/bench/live-drafter.txt" 2>"$L/live-drafter.log"
  cat "$OUT/bench/live-drafter.txt"
}

case "${1:-}" in
target) target ;;
target-more) target_more ;;
target-ul) target_ul ;;
live) live ;;
drafter) drafter ;;
bench) bench ;;
eagle3) eagle3 ;;
eagle3-live) eagle3_live ;;
export-target) export_target "${2:-}" ;;
export-drafter) export_drafter "${2:-}" ;;
*) echo "usage: pipeline.sh target|target-more|target-ul|drafter|bench|live|eagle3|eagle3-live|export-target DEST|export-drafter DEST" >&2; exit 2 ;;
esac
