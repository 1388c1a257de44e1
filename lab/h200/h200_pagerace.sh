#!/usr/bin/env bash
# The live page's race on the GPU machine: `webdraft serve` with the tree's
# pair (the EAGLE-3 head drafting for the target, the standalone drafter
# for /draft) and lab/pagerace against it over the page's websocket, greedy
# and at each temperature of TEMPS, ROUNDS races each (round i with seed
# i); with DRAFTER=1 the same again with the standalone drafter drafting.
# WEBDRAFT and PAGERACE are binaries built here (lab/h200/h200_pack.sh
# webdraft; `go build -o .gpu/pagerace ./lab/pagerace`, xz-packed beside
# it).
#
#   bash lab/h200/h200_setup.sh && WEBDRAFT=.gpu/webdraft PAGERACE=.gpu/pagerace [K=4] [ROUNDS=4] [TEMPS="0 0.7 1"] [DRAFTER=1] bash lab/h200/h200_pagerace.sh
set -u
WEBDRAFT=${WEBDRAFT:?set WEBDRAFT to the webdraft binary}
PAGERACE=${PAGERACE:?set PAGERACE to the pagerace binary}
K=${K:-4}
ROUNDS=${ROUNDS:-4}
TEMPS=${TEMPS:-0 0.7 1}
TOKENS=${TOKENS:-64}
race() { # label, then serve's model flags
  local label=$1
  shift
  "$WEBDRAFT" serve --addr 127.0.0.1:8097 --backend webgpu "$@" > "/tmp/race-serve-$label.log" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do python3 -c "import urllib.request as u; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:8097/health')" 2>/dev/null && break; sleep 0.5; done
  for t in $TEMPS; do
    echo "== $label, k $K, temperature $t"
    timeout 120 "$PAGERACE" --addr 127.0.0.1:8097 --k "$K" --rounds "$ROUNDS" --max-tokens "$TOKENS" --temperature "$t" 2>&1 || echo "$label: no result"
  done
  kill $pid
  wait $pid
  grep -m1 -i 'adapter\|device' "/tmp/race-serve-$label.log"
}
race head --model weights/eagle3 --draft-model weights/drafter --target weights/target
if [ "${DRAFTER:-0}" = 1 ]; then
  race drafter --model weights/drafter --target weights/target
fi
