#!/usr/bin/env bash
# The performance issue's measurements on the GPU machine, in one run: a
# random HF-built Qwen3-1.7B converted to int4; the WebGPU engine's greedy
# drafts against the CPU reference's; `webdraft bench engine` with the batch
# plot and the per-kernel profile; the server under load at concurrency 1
# and 32 on ~1k-token contexts already cached (`loadtest --warm`); with
# HF=1, Hugging Face transformers on the same checkpoint (eager, then static
# cache + torch.compile: about 4 more minutes); with KERNELS=a kernels.test
# binary (`go test -c ./kernels`), BenchmarkMatMulKernels (KBENCH picks
# its sub-benchmarks; about 1–3 minutes); with RECORD=a webgpu.test binary
# (`go test -c ./engine/webgpu`), the host's recording time of a pass; with
# NVSASS=an nvsass binary (`CGO_ENABLED=0 go build ./lab/nvsass`) and
# KERNELS, the machine code NVIDIA's driver made of the main kernels, each
# from a benchmark run with the driver's shader cache in a fresh folder
# (sass/NAME.txt: registers and each loop's instructions; under a minute);
# with GRIDSYNC=a gridsync.test binary (`go test -c ./lab/gridsync`), BenchmarkGridSync:
# dependent dispatches of GPU-wide grids against barriers inside one
# (under a minute). About 4 minutes without the options.
#
# The device call returns at most 8 files: everything lands in one folder,
# packed into $OUT/results.tgz, and the main figures are printed.
#
#   WEBDRAFT=.gpu/webdraft OUT=$OUT [HF=1] [KERNELS=.gpu/kernels.test [KBENCH=regexp]
#     [NVSASS=.gpu/nvsass]] [RECORD=.gpu/webgpu.test] [GRIDSYNC=.gpu/gridsync.test] bash lab/h200/h200_perf.sh
set -u
W=${WEBDRAFT:?set WEBDRAFT to a webdraft binary}
OUT=${OUT:?set OUT to a results folder}
R=$(mktemp -d)
trap 'tar czf "$OUT/results.tgz" -C "$R" . && cp "$R/engine.txt" "$R/steps.svg" "$OUT/" 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
if [ -n "${RECORD:-}" ]; then
  rec=$(realpath "$RECORD")
  (cd engine/webgpu && "$rec" -test.run '^$' -test.bench RecordDecodeStep -test.benchtime 300x) > "$R/record.txt" 2>&1
  grep Bench "$R/record.txt"
fi
if [ -n "${KERNELS:-}" ]; then
  timeout 240 "$KERNELS" -test.run '^$' -test.bench "${KBENCH:-MatMulKernels}" -test.benchtime 100ms > "$R/kbench.txt" 2>&1
  grep -c '^Benchmark' "$R/kbench.txt"
fi
if [ -n "${NVSASS:-}" ]; then
  : "${KERNELS:?NVSASS needs KERNELS, a kernels.test binary}"
  mkdir -p "$R/sass"
  while read -r name bench; do
    cache=$(mktemp -d)
    __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1 __GL_SHADER_DISK_CACHE_PATH=$cache \
      timeout 60 "$KERNELS" -test.run '^$' -test.bench "$bench" -test.benchtime 10ms > /dev/null 2>&1
    "$NVSASS" -out "$R/sass/$name" "$cache" > "$R/sass/$name.txt" 2>&1
    echo "sass $name: $(grep -c registers "$R/sass/$name.txt") pipelines, $(grep -c ' loop ' "$R/sass/$name.txt") loops"
  done <<'EOF'
matvec-T1 MatMulKernels/qkv_2048x4096/T1/matvec$
row-tile-T1 MatMulKernels/down_6144x2048/T1/row-tile$
matvec-batch-T4 MatMulKernels/o_2048x2048/T4/matvec-batch$
skinny-T8 MatMulKernels/gate_up_2048x12288/T8/skinny$
skinny-T32 MatMulKernels/gate_up_2048x12288/T32/skinny$
skinny-T1024 MatMulKernels/gate_up_2048x12288/T1024/skinny$
gemm-T64 MatMulKernels/gate_up_2048x12288/T64/gemm-4$
attention-decode-T32 AttentionDecode/T32/wg=64/workgroups=1024/max=256/vb=8$
EOF
fi
python3 lab/h200/random_hf_checkpoint.py --shape qwen3-1.7b --out /tmp/q17hf > "$R/ckpt.txt" 2>&1 || { cat "$R/ckpt.txt"; exit 1; }
"$W" convert --in /tmp/q17hf --out /tmp/q17 --quant int4 2>&1 | tail -1
# the last prompt takes the prefill kernels past one tile of rows and keys
for ids in 785,3974,13876 1,2,3,4,5,6,7,8,9,10 $(seq -s, 1000 7 2400); do
  a=$("$W" draft --model /tmp/q17 --ids "$ids" --n 16 --backend webgpu 2>>"$R/e2e.err")
  b=$(timeout 100 "$W" draft --model /tmp/q17 --ids "$ids" --n 16 --backend cpu 2>>"$R/e2e.err")
  echo "draft $ids: webgpu $a cpu $b $([ "$a" = "$b" ] && echo SAME || echo DIFFERENT)"
done | tee "$R/e2e.txt"
"$W" bench engine --model /tmp/q17 --context 1024 --batches 1,2,4,8,16,32,64 --steps 32 --prefill 1024 \
  --svg "$R/steps.svg" 2>&1 | grep -v '^time=' | tee "$R/engine.txt"
"$W" bench engine --model /tmp/q17 --context 1024 --batches 1,32 --steps 4 --prefill 1024 --copy-mb 256 --profile 2>&1 |
  sed -n '/GPU time/,$p' | tee "$R/profile.txt"
"$W" serve --model /tmp/q17 --cache-mb 20000 --addr 127.0.0.1:8080 > "$R/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/health')" 2>/dev/null && break; sleep 0.5; done
# --warm: the issue's figures, /draft on ~1k-token contexts already cached.
for c in 1 32; do
  echo "concurrency $c, contexts cached:"
  timeout 120 "$W" loadtest --concurrency $c --conversations $((c == 1 ? 8 : 64)) --turns 10 --min-prompt 1000 --max-prompt 1024 --warm 2>&1 |
    tee "$R/load-c$c.txt"
done
kill $pid; wait $pid
if [ "${HF:-0}" = 1 ]; then
  timeout 270 python3 lab/h200/hf_draft_bench.py --model /tmp/q17hf --context 1024 --batches 1,32 2>&1 | grep '^{' | tee "$R/hf.txt"
fi
if [ -n "${GRIDSYNC:-}" ]; then
  timeout 90 "$GRIDSYNC" -test.run '^$' -test.bench 'GridSync/G=(132|528)/(fence|nofence)/(dispatches|barriers)' \
    -test.benchtime 10x > "$R/gridsync.txt" 2>&1
  grep '^Benchmark' "$R/gridsync.txt" || echo "gridsync: no benchmark ran (skipped on CPU adapters; see gridsync.txt)"
fi
