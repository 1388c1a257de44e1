#!/usr/bin/env python3
"""Reads a Node CPU profile (node --cpu-prof; h200.sh's PROFILE=1 writes
engine.cpuprofile) and prints where the time went: by kind — the Go program
(wasm functions), wasm_exec.js (syscall/js's glue), the harness and worker,
Node and Dawn (native functions, "(program)", the garbage collector) — and
the functions with the most self time, and, with --inclusive, the most total
time.

    python3 lab/dawn/cpuprofile.py engine.cpuprofile [--top 30] [--inclusive]
"""
import argparse
import collections
import json
import sys


def kind(frame):
    url, name = frame["url"], frame["functionName"]
    if url.startswith("wasm://") or url.split("?")[0].endswith(".wasm"):
        return "Go program (wasm)"
    if url.endswith("wasm_exec.js"):
        return "wasm_exec.js (syscall/js glue)"
    if url.endswith(("harness.cjs", "worker.js", "navigator.cjs")):
        return "harness and worker"
    if name in ("(garbage collector)",):
        return "garbage collector"
    if name in ("(idle)",):
        return "idle (waiting on the GPU or a timer)"
    if name in ("(program)",) or not url:
        return "Node and Dawn (native)"
    return "other JavaScript"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--inclusive", action="store_true", help="also list the functions by total time (self and callees)")
    a = ap.parse_args()
    try:
        with open(a.profile) as f:
            p = json.load(f)
    except (OSError, ValueError) as err:
        sys.exit(f"cpuprofile.py: {a.profile}: {err}")
    nodes = {n["id"]: n for n in p["nodes"]}
    parent = {}
    for n in p["nodes"]:
        for c in n.get("children", []):
            parent[c] = n["id"]
    self_us = collections.Counter()
    for sid, dt in zip(p["samples"], p["timeDeltas"]):
        self_us[sid] += dt
    total = sum(self_us.values())
    by_kind, by_fn, incl = collections.Counter(), collections.Counter(), collections.Counter()
    for nid, us in self_us.items():
        fr = nodes[nid]["callFrame"]
        by_kind[kind(fr)] += us
        by_fn[(fr["functionName"] or "(anonymous)", kind(fr))] += us
        seen, x = set(), nid
        while x is not None:  # every distinct function on the stack gets the sample
            f2 = nodes[x]["callFrame"]
            key = (f2["functionName"] or "(anonymous)", kind(f2))
            if key not in seen:
                incl[key] += us
                seen.add(key)
            x = parent.get(x)
    print(f"{a.profile}: {total / 1e6:.2f} s sampled\n")
    print("| kind | self s | share |\n| --- | ---: | ---: |")
    for k, us in by_kind.most_common():
        print(f"| {k} | {us / 1e6:.2f} | {100 * us / total:.1f} % |")
    print(f"\n| function (self time, top {a.top}) | kind | self s | share |\n| --- | --- | ---: | ---: |")
    for (name, k), us in by_fn.most_common(a.top):
        print(f"| `{name}` | {k} | {us / 1e6:.3f} | {100 * us / total:.1f} % |")
    if a.inclusive:
        print(f"\n| function (total time, top {a.top}) | kind | total s | share |\n| --- | --- | ---: | ---: |")
        for (name, k), us in incl.most_common(a.top):
            print(f"| `{name}` | {k} | {us / 1e6:.3f} | {100 * us / total:.1f} % |")


if __name__ == "__main__":
    main()
