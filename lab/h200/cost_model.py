#!/usr/bin/env python3
"""The cost model of speculative decoding at real shapes, from one run's files.

Reads what lab/h200/h200_shapes.sh leaves in a results folder —
engine-SHAPE.txt (`webdraft bench engine`) and peer.txt
(lab/h200/int4_peer.py) — and prints, for a target and each drafter, on
webdraft and on the CUDA int4 peer, a Markdown table of:

  - t_draft / t_target: a drafter step over a target step, both batch 1
    (webdraft: chained steps, as a draft and a plain decode run; the peer:
    its torch.compile'd step where it ran, else eager, each a CUDA graph);
  - t_verify(k+1) / t_target: a verification of k + 1 rows over the step;
  - the τ at which a round of k drafted tokens breaks even,
    (k · t_draft + t_verify(k+1)) / t_target;
  - the projected speedup τ(k) · t_target / (k · t_draft + t_verify(k+1)) for
    the τ public reports give a Qwen3-8B pair at k = 16, carried to other k by
    the usual model of independent acceptances, τ(k) = (1 − a^(k+1)) / (1 − a),
    a solved from τ(16).

With the target's `bench engine --head` figure, the same table for an
EAGLE-3 head of the target's shape (its draft token's cost in place of a
drafter step; the same τ, so that the tables compare costs).

A tree of n nodes verifies at the cost of n + 1 rows, so the break-even
column holds for trees too, with the tree's drafting cost in place of
k · t_draft.

    python3 lab/h200/cost_model.py RESULTS_DIR [--target qwen3-8b] \\
        [--drafters qwen3-0.6b,qwen3-1.7b] [--tau 4.6,5.31]
"""
import argparse
import os
import re
import sys


def engine_figures(path):
    """chained and single batch-1 steps, verifications by rows and, where
    `bench engine --head` ran, an EAGLE-3 head's draft token, ms."""
    f = {"verify": {}}
    with open(path) as fh:
        for line in fh:
            m = re.match(r"decode step, batch 1, .*?\s([\d.]+) ms", line)
            if m:
                f["single"] = float(m.group(1))
            m = re.match(r"\s+chained \d+ a draft \(StepN\), batch 1\s+([\d.]+) ms", line)
            if m:
                f["chained"] = float(m.group(1))
            m = re.match(r"verification, (\d+) rows .*?\s([\d.]+) ms", line)
            if m:
                f["verify"][int(m.group(1))] = float(m.group(2))
            m = re.match(r"EAGLE-3 head .*?, chained \d+ a draft, batch 1\s+([\d.]+) ms", line)
            if m:
                f["head"] = float(m.group(1))
    if "chained" not in f:
        raise ValueError(f"{path}: no chained batch-1 step")
    return f


def peer_figures(path):
    """shape → {"step": ms, "verify": {rows: ms}}: torch.compile'd figures
    where the batch-1 step was compiled (verifications that were not are
    left out, so that no ratio mixes the two), else eager ones."""
    raw = {}  # shape → figure → (eager ms, compiled ms or None)
    with open(path) as fh:
        for line in fh:
            cells = line.rstrip("\n").split("\t")
            if len(cells) < 3 or line.startswith("#"):
                continue
            compiled = None
            for c in cells[3:]:
                m = re.match(r"([\d.]+) ms torch.compile", c)
                if m:
                    compiled = float(m.group(1))
            raw.setdefault(cells[0], {})[cells[1]] = (float(cells[2].split()[0]), compiled)
    out = {}
    for shape, figures in raw.items():
        step = figures.get("decode step, batch 1")
        if step is None:
            continue
        pick = 1 if step[1] is not None else 0
        f = out[shape] = {"step": step[pick], "verify": {}}
        for figure, ms in figures.items():
            m = re.match(r"verification, (\d+) rows", figure)
            if m and ms[pick] is not None:
                f["verify"][int(m.group(1))] = ms[pick]
    return out


def acceptance(tau16, k=16):
    """a with (1 − a^(k+1)) / (1 − a) = tau16, by bisection."""
    lo, hi = 0.0, 1.0 - 1e-9
    for _ in range(100):
        a = (lo + hi) / 2
        if (1 - a ** (k + 1)) / (1 - a) < tau16:
            lo = a
        else:
            hi = a
    return (lo + hi) / 2


def table(name, t_target, t_draft, verify, taus):
    alphas = [acceptance(t) for t in taus]
    head = ["k", "t_draft / t_target", "t_verify(k+1) / t_target", "break-even τ"]
    head += [f"τ(k), speedup at τ(16) = {t}" for t in taus]
    print(f"\n{name}: t_target {t_target:.3f} ms, t_draft {t_draft:.3f} ms\n")
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join(["---:"] * len(head)) + " |")
    for rows in sorted(verify):
        k = rows - 1
        if k < 1:
            continue
        cost = k * t_draft + verify[rows]
        cells = [str(k), f"{t_draft / t_target:.2f}", f"{verify[rows] / t_target:.2f}", f"{cost / t_target:.2f}"]
        for a in alphas:
            tau = (1 - a ** (k + 1)) / (1 - a)
            cells.append(f"{tau:.2f}: {tau * t_target / cost:.2f}×")
        print("| " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--target", default="qwen3-8b")
    ap.add_argument("--drafters", default="qwen3-0.6b,qwen3-1.7b")
    ap.add_argument("--tau", default="4.6,5.31", help="τ at k = 16 of the pairs to project")
    args = ap.parse_args()
    taus = [float(t) for t in args.tau.split(",")]
    drafters = args.drafters.split(",")

    def engine(shape):
        return engine_figures(os.path.join(args.results, f"engine-{shape}.txt"))

    try:
        tgt = engine(args.target)
    except (OSError, ValueError) as e:
        sys.exit(f"cost_model: the target: {e}")
    for d in drafters:
        try:
            draft = engine(d)
        except (OSError, ValueError) as e:
            print(f"cost_model: drafter {d} left out: {e}", file=sys.stderr)
            continue
        table(f"webdraft, {args.target} with {d}", tgt["chained"], draft["chained"], tgt["verify"], taus)
    if "head" in tgt:
        table(f"webdraft, {args.target} with an EAGLE-3 head (random int4, one layer of its shape)",
              tgt["chained"], tgt["head"], tgt["verify"], taus)
    peer_path = os.path.join(args.results, "peer.txt")
    if os.path.exists(peer_path):
        peer = peer_figures(peer_path)
        for d in drafters:
            if args.target in peer and d in peer:
                p = peer[args.target]
                table(f"PyTorch int4 peer, {args.target} with {d}", p["step"], peer[d]["step"], p["verify"], taus)


if __name__ == "__main__":
    main()
