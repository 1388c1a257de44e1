#!/bin/bash
# measure.sh [REPO]: a new clone's first `go tool task serve`, timed as a
# newcomer meets it — a fresh clone of REPO (default: this checkout's
# repository) with empty Go module and build caches — until GET /health
# answers 200. Prints each line of task's output with the seconds since
# the start, then the total; stops the server after.
set -euo pipefail
repo=${1:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
root=$(mktemp -d)
trap 'kill -- -"$pid" 2>/dev/null || true; chmod -R u+w "$root" 2>/dev/null; rm -rf "$root"' EXIT
git clone -q "$repo" "$root/webdraft"
cd "$root/webdraft"
export GOMODCACHE=$root/mod GOCACHE=$root/cache GOPATH=$root/gopath
addr=127.0.0.1:${PORT:-18080}
start=${EPOCHREALTIME/./}
elapsed() { local us=$((${EPOCHREALTIME/./} - start)); printf '%d.%d' $((us / 1000000)) $((us % 1000000 / 100000)); }
setsid bash -c "go tool task serve ADDR=$addr 2>&1" > >(while IFS= read -r line; do printf '%6s  %s\n' "$(elapsed)" "$line"; done) &
pid=$!
until curl -sf "http://$addr/health" >/dev/null; do
	kill -0 "$pid" 2>/dev/null || { echo "task serve ended before the server was healthy" >&2; exit 1; }
	sleep 0.2
done
printf '%6s  GET /health: 200 — clone to healthy\n' "$(elapsed)"
