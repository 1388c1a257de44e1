#!/usr/bin/env bash
# A fresh server's first requests on the GPU machine, with and without the
# warm-up (`serve --warmup`): for each setting of WARMUPS a new `webdraft
# serve` (the tree's pair and head: lab/h200/h200_pack.sh builds without
# the embedded models), then lab/h200/first_requests.py
# against it. Each serve is a new process; the driver's own cache of
# compiled pipelines (~/.cache/nvidia) persists between them, so the
# first setting run pays the most: RUNS repeats the list.
#
#   bash lab/h200/h200_setup.sh && WEBDRAFT=.gpu/webdraft [WARMUPS="off auto"] [RUNS=2] bash lab/h200/h200_firstrequest.sh
set -u
WEBDRAFT=${WEBDRAFT:?set WEBDRAFT to the webdraft binary}
WARMUPS=${WARMUPS:-off auto}
RUNS=${RUNS:-2}
for run in $(seq "$RUNS"); do
  for w in $WARMUPS; do
    echo "== run $run, --warmup $w"
    "$WEBDRAFT" serve --addr 127.0.0.1:8096 --warmup "$w" --model weights/eagle3 --draft-model weights/drafter --target weights/target > "/tmp/first-serve-$w-$run.log" 2>&1 &
    pid=$!
    python3 lab/h200/first_requests.py --addr 127.0.0.1:8096 || tail -5 "/tmp/first-serve-$w-$run.log"
    kill $pid
    wait $pid
    grep -m1 'msg=engine' "/tmp/first-serve-$w-$run.log"
    grep -E 'prepared|warmed up|warm-up failed' "/tmp/first-serve-$w-$run.log"
  done
done
