#!/usr/bin/env bash
# Runs on the GPU machine (lab/treegpu/README.md): each tree shape with the
# lab build, then the mean of its steps (the first 20 left out) — the
# step's wall time, the wait after its one submission (its GPU time) and
# the host's time before it.
#
#   bash lab/h200/h200_setup.sh && WB=.gpu/wB OUT=$OUT bash lab/treegpu/run.sh
set -u
wb=${WB:?the lab build, e.g. .gpu/wB}
out=${OUT:?a folder for the logs}
for tree in ${TREES:-4x16 5x64 2x8}; do
  for depth in ${DEPTHS:-6 3}; do
    echo "=== $tree, depth $depth"
    "$wb" bench spec --live --target weights/target --drafter weights/eagle3 --prompts weights/heldout_prompts.jsonl \
      --max-prompts 8 --new-tokens 128 --batch 1 --backend webgpu --ks 6 --trees "$tree" --tree-depth "$depth" \
      2> "$out/treegpu_${tree}_$depth.txt" | grep -E "^ +[0-9]+ +chained|fused"
    grep TREEPROF "$out/treegpu_${tree}_$depth.txt" | awk 'NR > 20 { n++; t += $2; w += $3 }
      END { printf "tree steps %d: wall %.3f ms, waited after the submission (GPU) %.3f ms, host before it %.3f ms\n", n, t/n/1000, w/n/1000, (t-w)/n/1000 }'
  done
done
