#!/usr/bin/env python3
"""The PyTorch-on-CPU peer of webdraft's CPU engine: the same Qwen3 forward
pass, in float32 on the same (dequantized int4) weights, timed on the CPU.

It loads a webdraft model folder (config.json + model.safetensors), prefills a
random context into a static KV cache, then times a one-token decode step
(forward + greedy argmax) and verification passes of R rows, each at the
position just after the context (the cache does not grow between repeats).

Prints a table on stderr and one JSON line on stdout:

    python3 lab/cpupeer/torch_step.py --model weights/target --threads 2 --context 512
    python3 lab/cpupeer/torch_step.py --model weights/target --check   # {"draft": [...]}
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"F32": np.float32, "F16": np.float16, "U32": np.uint32, "I32": np.int32}


@dataclass
class Config:
    vocab: int
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    theta: float
    max_pos: int
    tied: bool

    @classmethod
    def read(cls, path):
        with open(path) as f:
            c = json.load(f)
        theta = c.get("rope_parameters", {}).get("rope_theta", c.get("rope_theta"))
        return cls(vocab=c["vocab_size"], hidden=c["hidden_size"], inter=c["intermediate_size"],
                   layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
                   kv_heads=c["num_key_value_heads"],
                   head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                   eps=c["rms_norm_eps"], theta=float(theta), max_pos=c["max_position_embeddings"],
                   tied=c.get("tie_word_embeddings", False))


def read_safetensors(path):
    """Returns ({name: numpy array}, metadata) of a .safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    arrays = {}
    for name, t in header.items():
        if t["dtype"] not in DTYPES:
            sys.exit(f"{path}: tensor {name} has dtype {t['dtype']}, which this script does not read")
        begin, end = t["data_offsets"]
        arrays[name] = np.frombuffer(data, DTYPES[t["dtype"]], offset=8 + n + begin,
                                     count=(end - begin) // np.dtype(DTYPES[t["dtype"]]).itemsize).reshape(t["shape"])
    return arrays, meta


def matrix(arrays, name, group):
    """The float32 matrix W[out][in] stored as int4 NAME.qweight + NAME.scales
    (value = (code - 8) * scale), or as plain F32 NAME."""
    if name in arrays:
        return torch.from_numpy(arrays[name].astype(np.float32))
    if name + ".qweight" not in arrays or name + ".scales" not in arrays:
        raise KeyError(name)
    qw, scales = arrays[name + ".qweight"], arrays[name + ".scales"].astype(np.float32)
    out, cols = qw.shape[0], qw.shape[1] * 8
    codes = (qw[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15  # (out, in/8, 8): nibble j = column 8c+j
    vals = codes.reshape(out, cols // group, group).astype(np.float32) - 8  # (out, in/G, G)
    return torch.from_numpy((vals * scales[:, :, None]).reshape(out, cols))


def load(folder):
    """Returns (cfg, weights): weights is a dict of float32 torch tensors."""
    cfg = Config.read(os.path.join(folder, "config.json"))
    arrays, meta = read_safetensors(os.path.join(folder, "model.safetensors"))
    group = embed_group = int(meta.get("group_size", 32))
    embed_name = "model.embed_tokens.weight"
    if embed_name + ".qweight" not in arrays and embed_name not in arrays and "shared_embedding" in meta:
        # a drafter sharing its target's embedding: a folder relative to this one
        shared, smeta = read_safetensors(os.path.join(folder, meta["shared_embedding"], "model.safetensors"))
        arrays.update({k: v for k, v in shared.items() if k.startswith(embed_name)})
        embed_group = int(smeta.get("group_size", 32))

    def get(name, group=group):
        try:
            return matrix(arrays, name, group)
        except KeyError:
            sys.exit(f"{folder}: tensor {name} is missing (this script needs a complete Qwen3 folder)")

    W = {"embed": get(embed_name, embed_group), "norm": get("model.norm.weight"), "layers": []}
    names = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "self_attn.q_norm", "self_attn.k_norm", "post_attention_layernorm",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    for i in range(cfg.layers):
        W["layers"].append({n.split(".")[-1]: get(f"model.layers.{i}.{n}.weight") for n in names})
    has_head = "lm_head.weight" in arrays or "lm_head.weight.qweight" in arrays
    W["head"] = get("lm_head.weight") if has_head or not cfg.tied else W["embed"]
    W["head_ids"] = None  # head row i scores token i
    if "lm_head.token_ids" in arrays:  # a head over part of the vocabulary
        W["head_ids"] = torch.from_numpy(arrays["lm_head.token_ids"].astype(np.int64))
        if not has_head:
            W["head"] = W["embed"][W["head_ids"]].contiguous()
    params = sum(t.numel() for t in [W["embed"], W["norm"]] + [t for l in W["layers"] for t in l.values()])
    W["params"] = params + (W["head"].numel() if has_head else 0)
    return cfg, W


def rope_tables(cfg, n):
    """cos, sin (n, D) for positions 0 … n-1, split-halves layout."""
    inv_freq = 1.0 / cfg.theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim)
    freqs = torch.arange(n, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (n, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (n, D)
    return emb.cos(), emb.sin()


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):
    """x (T, heads, D); cos, sin (T, D): x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def forward(cfg, W, cache, rope_cs, ids, pos, n_out):
    """Runs ids (T,) at positions pos … pos+T-1, writing their keys and values
    into cache at those rows, and returns the logits of the last n_out rows
    (n_out, head rows)."""
    T, L = ids.shape[0], pos + ids.shape[0]
    KV, G, D = cfg.kv_heads, cfg.heads // cfg.kv_heads, cfg.head_dim
    cos, sin = rope_cs[0][pos:L], rope_cs[1][pos:L]  # (T, D)
    mask = None
    if T > 1:  # query t (position pos+t) sees keys 0 … pos+t
        mask = torch.full((T, L), float("-inf")).triu_(pos + 1)  # (T, L)
    x = W["embed"][ids]  # (T, H)
    for w, (k_cache, v_cache) in zip(W["layers"], cache):  # caches (KV, max_len, D)
        h = rms_norm(x, w["input_layernorm"], cfg.eps)
        q = rms_norm(F.linear(h, w["q_proj"]).view(T, cfg.heads, D), w["q_norm"], cfg.eps)  # (T, heads, D)
        k = rms_norm(F.linear(h, w["k_proj"]).view(T, KV, D), w["k_norm"], cfg.eps)  # (T, KV, D)
        v = F.linear(h, w["v_proj"]).view(T, KV, D)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k_cache[:, pos:L] = k.transpose(0, 1)
        v_cache[:, pos:L] = v.transpose(0, 1)
        # GQA: query head kv*G+g reads kv head kv; group them as (KV, G*T, D)
        qg = q.view(T, KV, G, D).permute(1, 2, 0, 3).reshape(KV, G * T, D)
        scores = torch.bmm(qg, k_cache[:, :L].transpose(1, 2)) * D ** -0.5  # (KV, G*T, L)
        if mask is not None:
            scores = (scores.view(KV, G, T, L) + mask).view(KV, G * T, L)
        attn = torch.bmm(scores.softmax(-1), v_cache[:, :L])  # (KV, G*T, D)
        attn = attn.view(KV, G, T, D).permute(2, 0, 1, 3).reshape(T, cfg.heads * D)
        x = x + F.linear(attn, w["o_proj"])
        h = rms_norm(x, w["post_attention_layernorm"], cfg.eps)
        x = x + F.linear(F.silu(F.linear(h, w["gate_proj"])) * F.linear(h, w["up_proj"]), w["down_proj"])
    h = rms_norm(x[T - n_out:], W["norm"], cfg.eps)  # (n_out, H)
    return F.linear(h, W["head"])  # (n_out, head rows)


def greedy(W, logits):
    """The token of each row's largest logit (first on ties)."""
    idx = torch.argmax(logits, dim=-1)
    return W["head_ids"][idx] if W["head_ids"] is not None else idx


def blas():
    """The BLAS torch's matmuls run on. Debian's torch calls the system
    libblas.so.3: the slow reference BLAS unless OpenBLAS provides it."""
    if torch.backends.mkl.is_available():
        return "mkl"
    maps = open("/proc/self/maps").read()
    return "openblas" if "openblas" in maps else "reference" if "libblas" in maps else "unknown"


def median_ms(fn, reps, warmup=3):
    """Median milliseconds of fn over reps calls, after warmup calls."""
    times = []
    for _ in range(warmup + reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[warmup:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a webdraft model folder")
    ap.add_argument("--context", type=int, default=512, help="cached tokens before the timed passes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rows", default="1,5,7,9,17", help="verification pass sizes (k+1)")
    ap.add_argument("--check", action="store_true", help="print 8 greedy tokens after 785,3974,13876 and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg, W = load(args.model)
    rows = [int(r) for r in args.rows.split(",")]
    max_len = 11 if args.check else args.context + max(rows)
    if max_len > cfg.max_pos:
        sys.exit(f"context {args.context} + {max(rows)} rows exceed max_position_embeddings {cfg.max_pos}")
    cache = [(torch.zeros(cfg.kv_heads, max_len, cfg.head_dim), torch.zeros(cfg.kv_heads, max_len, cfg.head_dim))
             for _ in range(cfg.layers)]
    rope_cs = rope_tables(cfg, max_len)

    with torch.inference_mode():
        if args.check:
            ids, pos, draft = [785, 3974, 13876], 0, []
            while len(draft) < 8:  # the prompt, then each drafted token at the next position
                draft.append(int(greedy(W, forward(cfg, W, cache, rope_cs, torch.tensor(ids), pos, 1))[-1]))
                pos, ids = pos + len(ids), draft[-1:]
            print(json.dumps({"draft": draft}))
            return

        g = torch.Generator().manual_seed(0)
        tokens = lambda n: torch.randint(0, cfg.vocab, (n,), generator=g)
        forward(cfg, W, cache, rope_cs, tokens(args.context), 0, 1)  # prefill
        one = tokens(1)
        step_ms = median_ms(lambda: int(greedy(W, forward(cfg, W, cache, rope_cs, one, args.context, 1))[-1]),
                            args.reps)
        verify_ms = {}
        for r in rows:
            ids = tokens(r)
            verify_ms[str(r)] = median_ms(lambda: greedy(W, forward(cfg, W, cache, rope_cs, ids, args.context, r)),
                                          args.reps)

    name, lib = os.path.basename(os.path.normpath(args.model)), blas()
    print(f"{name}: {W['params'] / 1e6:.1f}M params, torch {torch.__version__} ({lib} BLAS), {args.threads} threads, "
          f"context {args.context}, median of {args.reps}", file=sys.stderr)
    if lib == "reference":
        print("  warning: the reference BLAS is slow; install OpenBLAS (Debian: libopenblas0-openmp)", file=sys.stderr)
    print(f"  {'step (1 row + argmax)':<24}{step_ms:8.2f} ms", file=sys.stderr)
    for r, ms in verify_ms.items():
        print(f"  {'verify ' + r + ' rows':<24}{ms:8.2f} ms", file=sys.stderr)
    print(json.dumps({"model": args.model, "threads": args.threads, "context": args.context,
                      "torch": torch.__version__.split("+")[0], "blas": lib, "step_ms": round(step_ms, 3),
                      "verify_ms": {r: round(ms, 3) for r, ms in verify_ms.items()}, "params": W["params"]}))


if __name__ == "__main__":
    main()
