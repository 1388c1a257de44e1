#!/usr/bin/env python3
"""The CUDA int4 peer of `webdraft bench engine` on the GPU machine.

A Qwen3 decoder at a published shape with random int4 weights (group 32,
every projection and the head), run the way the fastest plain-PyTorch int4
path runs it: torch's tinygemm kernel (`torch._weight_int4pack_mm`, bf16
activations), a static bf16 KV cache, SDPA attention with grouped heads,
the whole step compiled by `torch.compile` and replayed as one CUDA graph.
It times, at a context of --context tokens:

  - a decode step of --batches sequences (one token each), batch 1 first;
  - a verification of --rows tokens of one sequence (causal over the new
    rows; every row's logits and argmax), as a target checks rows − 1
    drafted tokens;
  - with --matmuls, each projection alone at 1, 9 and 17 activation rows,
    over copies of its weights that together exceed the L2 cache.

Each figure is the median over --reps replays of the graph, timed with CUDA
events: the step eager, and for the figures --compile names also compiled by
torch.compile (a compilation takes about a minute). Print format: one
tab-separated line a figure.

The KV cache is one static tensor a layer, written in place by
index_copy_ at the new rows' positions (as gpt-fast does): a slice
assignment into one tensor of all layers made torch.compile copy the whole
cache in every layer.

    python3 lab/h200/int4_peer.py --shapes qwen3-8b,qwen3-1.7b --context 1024 \\
        --batches 1,16 --rows 5,9,17 --matmuls
"""
import argparse
import math
import statistics
import sys
import time

import torch
import torch._dynamo
import torch.nn.functional as F

SHAPES = {
    # hidden, intermediate, layers, heads, kv heads, head dim, vocab
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, 151936),
    "qwen3-4b": (2560, 9728, 36, 32, 8, 128, 151936),
    "qwen3-8b": (4096, 12288, 36, 32, 8, 128, 151936),
}
GROUP = 32
INNER_K_TILES = 8


class Int4Linear:
    """An N × K int4 matrix in tinygemm's packed layout, random codes and
    scales (the values do not matter to the timing)."""

    def __init__(self, n, k, gen):
        codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
        self.w = torch._convert_weight_to_int4pack(codes, INNER_K_TILES)
        sz = torch.empty(k // GROUP, n, 2, dtype=torch.bfloat16, device="cuda")
        sz[..., 0].uniform_(0.001, 0.01, generator=gen)
        sz[..., 1].zero_()
        self.sz = sz
        self.n, self.k = n, k

    def __call__(self, x):
        return torch._weight_int4pack_mm(x, self.w, GROUP, self.sz)


def rms_norm(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rotate(x, cos, sin):
    h = x.shape[-1] // 2
    r = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * cos + r * sin


class Model:
    def __init__(self, shape, maxlen, gen):
        H, I, L, nh, nkv, hd, V = SHAPES[shape]
        self.H, self.I, self.L, self.nh, self.nkv, self.hd, self.V = H, I, L, nh, nkv, hd, V
        bf = dict(dtype=torch.bfloat16, device="cuda")
        self.layers = []
        for _ in range(L):
            self.layers.append(dict(
                qkv=Int4Linear((nh + 2 * nkv) * hd, H, gen),
                o=Int4Linear(H, nh * hd, gen),
                gate_up=Int4Linear(2 * I, H, gen),
                down=Int4Linear(H, I, gen),
                n1=torch.ones(H, **bf), n2=torch.ones(H, **bf),
                qn=torch.ones(hd, **bf), kn=torch.ones(hd, **bf),
            ))
        self.norm = torch.ones(H, **bf)
        self.head = Int4Linear(V, H, gen)
        self.embed = torch.randn(V, H, generator=gen, **bf) * 0.02
        self.maxlen = maxlen
        self.caches = {}  # batch size B: per-layer K and V caches of B sequences

    def cache(self, B):
        """Allocates the static caches of B sequences (before any step of B:
        a compiled step then mutates whole tensors, not views of larger ones)."""
        if B not in self.caches:
            bf = dict(dtype=torch.bfloat16, device="cuda")
            shape = (B, self.nkv, self.maxlen, self.hd)
            self.caches[B] = ([torch.zeros(shape, **bf) for _ in range(self.L)],
                              [torch.zeros(shape, **bf) for _ in range(self.L)])

    def step(self, tokens, pos, cos, sin, mask):
        """tokens (B, T) at positions pos … pos + T − 1 of B sequences;
        returns each row's argmax (B, T)."""
        B, T = tokens.shape
        at = torch.arange(pos, pos + T, device="cuda")  # the rows' places in the cache
        nh, nkv, hd = self.nh, self.nkv, self.hd
        x = self.embed[tokens].reshape(B * T, self.H)
        ks, vs = self.caches[B]
        for i, l in enumerate(self.layers):
            qkv = l["qkv"](rms_norm(x, l["n1"]))
            q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            q = rms_norm(q.reshape(B, T, nh, hd), l["qn"]).transpose(1, 2)
            k = rms_norm(k.reshape(B, T, nkv, hd), l["kn"]).transpose(1, 2)
            v = v.reshape(B, T, nkv, hd).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            kc, vc = ks[i], vs[i]
            kc.index_copy_(2, at, k)
            vc.index_copy_(2, at, v)
            a = F.scaled_dot_product_attention(q, kc[:, :, :pos + T], vc[:, :, :pos + T],
                                               attn_mask=mask, enable_gqa=True)
            x = x + l["o"](a.transpose(1, 2).reshape(B * T, nh * hd))
            gu = l["gate_up"](rms_norm(x, l["n2"]))
            g, u = gu.split([self.I, self.I], dim=-1)
            x = x + l["down"](F.silu(g) * u)
        logits = self.head(rms_norm(x, self.norm))
        return logits.argmax(-1).reshape(B, T)


def rope(pos, T, hd):
    inv = 1.0 / (1e6 ** (torch.arange(0, hd, 2, device="cuda").float() / hd))
    t = torch.arange(pos, pos + T, device="cuda").float()
    f = torch.outer(t, inv)
    e = torch.cat((f, f), dim=-1)
    return e.cos().to(torch.bfloat16), e.sin().to(torch.bfloat16)


def graphed(fn, reps):
    """fn captured as a CUDA graph after warm-up; the median of reps replays, ms."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(reps + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times[2:])


def measure(shape, args):
    gen = torch.Generator(device="cuda").manual_seed(1)
    ctx = args.context
    rows = [int(r) for r in args.rows.split(",") if r]
    batches = [int(b) for b in args.batches.split(",") if b]
    compiled_for = set(args.compile.split(",")) if args.compile else set()
    t0 = time.time()
    m = Model(shape, ctx + max(rows + [1]) + 8, gen)
    for B in batches + [1]:
        m.cache(B)
    torch.cuda.synchronize()
    print(f"# {shape}: weights built in {time.time() - t0:.1f} s, "
          f"{torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated", flush=True)
    compiled = torch.compile(m.step, fullgraph=True, dynamic=False)
    runs = []  # (figure, key, tokens, cos, sin, mask)
    for B in batches:
        tok = torch.randint(0, m.V, (B, 1), device="cuda", generator=gen)
        runs.append((f"decode step, batch {B}", f"b{B}", tok, *rope(ctx, 1, m.hd), None))
    for T in rows:
        tok = torch.randint(0, m.V, (1, T), device="cuda", generator=gen)
        mask = torch.ones(T, ctx + T, dtype=torch.bool, device="cuda").tril(diagonal=ctx)
        runs.append((f"verification, {T} rows", f"r{T}", tok, *rope(ctx, T, m.hd), mask))
    for figure, key, tok, cos, sin, mask in runs:
        eager = graphed(lambda: m.step(tok, ctx, cos, sin, mask), args.reps)
        line = f"{shape}\t{figure}\t{eager:.3f} ms eager + CUDA graph"
        if key in compiled_for:
            t0 = time.time()
            try:
                c = graphed(lambda: compiled(tok, ctx, cos, sin, mask), args.reps)
                line += f"\t{c:.3f} ms torch.compile + CUDA graph (compiled in {time.time() - t0:.0f} s)"
            except Exception as e:  # the eager figure stands
                line += f"\ttorch.compile failed: {type(e).__name__}: {str(e)[:200]}"
        print(line, flush=True)
    del m, compiled
    torch.cuda.empty_cache()
    if args.matmuls:
        H, I, L, nh, nkv, hd, V = SHAPES[shape]
        for name, n, k in [("qkv", (nh + 2 * nkv) * hd, H), ("o", H, nh * hd), ("gate_up", 2 * I, H),
                           ("down", H, I), ("head", V, H)]:
            copies = max(1, math.ceil((256 << 20) / (n * k // 2)))
            ws = [Int4Linear(n, k, gen) for _ in range(min(copies, 16))]
            for T in (1, 9, 17):
                x = torch.randn(T, k, dtype=torch.bfloat16, device="cuda", generator=gen)

                def run():
                    for w in ws:
                        w(x)
                ms = graphed(run, args.reps) / len(ws)
                gb = (n * k / 2 + n * k / GROUP * 2) / (ms / 1e3) / 1e9
                print(f"{shape}\tmatmul {name} {n}x{k}, {T} rows\t{ms * 1e3:.1f} µs\t{gb:.0f} GB/s (int4 codes + bf16 scales)", flush=True)
            del ws
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="qwen3-8b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--rows", default="1,5,9,17")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--matmuls", action="store_true")
    ap.add_argument("--compile", default="b1,r17",
                    help="the figures also run compiled by torch.compile (bB: decode batch B, rT: T rows), each a compilation of about a minute")
    args = ap.parse_args()
    # Each shape, batch and row count is a graph of its own, all from one
    # Model.step: let dynamo keep them all.
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            sys.exit(f"--shapes: {shape!r}: want one of {', '.join(SHAPES)}")
        measure(shape, args)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
