#!/usr/bin/env bash
# Packs a binary for the GPU machine (run here; the machine has no Go): the
# webdraft command, or a package's test binary, built from the working tree
# or from a git revision, stripped and xz-compressed into .gpu/NAME.xz,
# which lab/h200/h200_setup.sh unpacks there. .gpu/ travels with the device
# call (keep it in .git/info/exclude); the tree and what it carries must
# stay under 64 MiB, about three webdraft binaries beside the tree.
#
#   bash lab/h200/h200_pack.sh NAME [REV] [PACKAGE]
#     NAME     the binary's name in .gpu/ (webdraft, wA, kernels.test …)
#     REV      a git revision to build instead of the working tree
#     PACKAGE  a package whose test binary to build (./kernels, ./gpu …)
#              instead of ./cmd/webdraft
# e.g. an A/B of a branch against main:
#   bash lab/h200/h200_pack.sh wA main && bash lab/h200/h200_pack.sh wB exp/branch
set -eu
name=${1:?usage: h200_pack.sh NAME [REV] [PACKAGE]}
rev=${2:-}
pkg=${3:-}
root=$(git rev-parse --show-toplevel)
mkdir -p "$root/.gpu"
src=$root
if [ -n "$rev" ]; then
  src=$(mktemp -d)
  git -C "$root" worktree add -q --detach "$src" "$rev"
  trap 'git -C "$root" worktree remove --force "$src"' EXIT
fi
bin=$(mktemp)
if [ -n "$pkg" ]; then
  (cd "$src" && go test -c -ldflags='-s -w' -o "$bin" "$pkg")
else
  # The embedded default model is not needed there (webdraft_noembed).
  (cd "$src" && go build -tags webdraft_noembed -ldflags='-s -w' -o "$bin" ./cmd/webdraft)
fi
xz --x86 --lzma2=preset=9e,dict=64MiB -c "$bin" > "$root/.gpu/$name.xz"
rm -f "$bin"
echo ".gpu/$name.xz: $(du -k "$root/.gpu/$name.xz" | cut -f1) KiB${rev:+ (from $rev)}"
