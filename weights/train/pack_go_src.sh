#!/usr/bin/env bash
# The Go toolchain's own sources as a second training corpus, packed on a
# machine with Go for the GPU machine (which has none): every .go file under
# $(go env GOROOT)/src, tests included, with the toolchain's LICENSE
# (BSD-3-Clause) and VERSION. Left out: any path with a testdata/ or vendor/
# component (vendored code has other licenses), files over 512 KiB, and
# files whose first 4 KiB say both "Code generated" and "DO NOT EDIT"
# (generated tables). The archive is deterministic for a given toolchain:
# sorted names, fixed mtime, owner and modes, single-threaded xz -9.
# prepare_data.py --go-src reads it.
#
#   bash weights/train/pack_go_src.sh .gpu/gosrc.tar.xz
set -euo pipefail
out=${1:?usage: pack_go_src.sh OUT.tar.xz}
limit=12000000 # bytes: the archive travels with the working tree
root=$(go env GOROOT)
for f in LICENSE VERSION; do
  [ -f "$root/$f" ] || { echo "pack_go_src: $root/$f is missing" >&2; exit 1; }
done
list=$(mktemp)
trap 'rm -f "$list"' EXIT

# -size -524289c: at most 524,288 bytes (512 KiB).
(cd "$root" && find src -type f -name '*.go' -size -524289c) |
  grep -Ev '(^|/)(testdata|vendor)/' | LC_ALL=C sort |
  while IFS= read -r f; do
    head=$(head -c 4096 "$root/$f" 2>/dev/null | tr -d '\0')
    if [[ $head == *"Code generated"* && $head == *"DO NOT EDIT"* ]]; then
      continue
    fi
    printf '%s\n' "$f"
  done >"$list"
files=$(wc -l <"$list")
bytes=$( (cd "$root" && tr '\n' '\0' <"$list" | du -cb --files0-from=- | tail -n 1 | cut -f 1))
printf '%s\n' LICENSE VERSION >>"$list"

mkdir -p "$(dirname "$out")"
tar -C "$root" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
  --mode='u=rw,go=r' -cf - --verbatim-files-from -T "$list" | xz -9 -T1 -c >"$out.tmp"
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
echo "pack_go_src: $(head -n 1 "$root/VERSION"): $files .go files, $bytes bytes (+ LICENSE, VERSION); $out: $size bytes xz"
if [ "$size" -gt "$limit" ]; then
  echo "pack_go_src: $out is over $limit bytes" >&2
  exit 1
fi
