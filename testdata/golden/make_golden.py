#!/usr/bin/env python3
"""Golden vectors from Hugging Face transformers for webdraft's Qwen3 reference.

Usage:  python3 testdata/golden/make_golden.py --out DIR [--no-newuser]

Writes, under DIR:
  tied/    config.json, model.safetensors (bf16), golden.json, int4_expected.safetensors
  untied/  config.json, model.safetensors (bf16), golden.json
  quant_cases.safetensors   edge cases of the int4 quantizer (docs/reference.md, "The int4 scheme")
  newuser/ a sharded checkpoint (model.safetensors.index.json + shards) and golden.json
           (not committed: the "new user" check; see README.md)

Needs torch, transformers (5.x; 4.x should work too), safetensors and numpy. Runs on CPU,
single-threaded, in f32; deterministic (fixed seeds, fixed seed search). See README.md.
"""

import argparse
import copy
import json
import os
import shutil
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

GROUP = 32
N_GREEDY = 16
MARGIN_REL = 1e-3          # a step is "near-tie" when top1-top2 < MARGIN_REL * max|logit|
MAX_SEED_ATTEMPTS = 8      # deterministic seed search: first seed with no near-tie step wins

MODELS = {
    "tied": dict(
        cfg=dict(vocab_size=1024, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=True),
        seed=1000, init_range=0.2, prompt_lens=[1, 40, 300], variants=["dense", "int4"],
        shard=None),
    "untied": dict(
        cfg=dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                 max_position_embeddings=512, rope_theta=1000000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=False),
        seed=2000, init_range=0.2, prompt_lens=[1, 40, 300], variants=["dense", "int4"],
        shard=None),
    "newuser": dict(
        cfg=dict(vocab_size=768, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                 num_attention_heads=6, num_key_value_heads=2, head_dim=24,
                 max_position_embeddings=512, rope_theta=1000000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=False),
        seed=3000, init_range=0.2, prompt_lens=[5, 60], variants=["dense"],
        shard="200KB"),
}


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------
# The int4 scheme (docs/reference.md, "The int4 scheme"), written twice: torch and numpy, cross-checked.
# ---------------------------------------------------------------------------------------------

def quantize_torch(w):
    """w: 2-D float tensor (any float dtype). Returns (q int8 [out,in], s16 f16 [out,in/G],
    deq f32 [out,in]). Scale and quotient in f32, the rounding exact (in f64, where x + 0.5
    is exact for any f32 x)."""
    w = w.detach().to(torch.float32).contiguous()
    out, inn = w.shape
    assert inn % GROUP == 0, (tuple(w.shape), GROUP)
    g = w.reshape(out, inn // GROUP, GROUP)
    m = g.abs().amax(dim=2)                                   # f32
    s16 = (m / torch.full_like(m, 7.0)).to(torch.float16)     # f32 division, then RNE to half
    s = s16.to(torch.float32).unsqueeze(2)
    x = g / s.expand_as(g)                                    # f32 division (inf/nan where s==0)
    xd = x.to(torch.float64)
    r = torch.sign(xd) * torch.floor(xd.abs() + 0.5)          # round half away from zero, exact
    r = torch.where(s.expand_as(g) == 0, torch.zeros_like(r), r)
    q = r.clamp(-8, 7).to(torch.int8)
    deq = (q.to(torch.float32) * s).reshape(out, inn)         # exact (<= 15 significant bits)
    return q.reshape(out, inn), s16, deq


def quantize_numpy(w32):
    """Independent numpy version of the same scheme; w32: np.float32 [out,in]."""
    assert w32.dtype == np.float32
    out, inn = w32.shape
    g = w32.reshape(out, inn // GROUP, GROUP)
    m = np.abs(g).max(axis=2)
    s16 = (m / np.float32(7.0)).astype(np.float32).astype(np.float16)
    s = s16.astype(np.float32)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        x = (g / s).astype(np.float32)
    xd = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        r = np.sign(xd) * np.floor(np.abs(xd) + 0.5)
    r = np.where(np.broadcast_to(s, g.shape) == 0, 0.0, r)
    q = np.clip(r, -8, 7).astype(np.int8).reshape(out, inn)
    return q, s16


def pack_torch(q):
    """q int8 [out,in] in -8..7 -> int32 [out,in/8] holding the u32 words (nibble q+8,
    element j of a word in bits 4j..4j+3)."""
    out, inn = q.shape
    assert inn % 8 == 0
    n = (q.to(torch.int64) + 8).reshape(out, inn // 8, 8)
    assert int(n.min()) >= 0 and int(n.max()) <= 15
    shifts = torch.arange(8, dtype=torch.int64) * 4
    words = (n << shifts).sum(dim=2)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    return words.to(torch.int32).contiguous()


def pack_numpy(q):
    out, inn = q.shape
    n = (q.astype(np.int32) + 8).astype(np.uint32).reshape(out, inn // 8, 8)
    words = np.zeros((out, inn // 8), dtype=np.uint32)
    for j in range(8):
        words |= n[:, :, j] << np.uint32(4 * j)
    return words.view(np.int32)


def unpack_torch(words, inn):
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(8, dtype=torch.int64) * 4
    n = (w.unsqueeze(2) >> shifts) & 0xF
    return (n - 8).reshape(words.shape[0], inn).to(torch.int8)


def quantize_checked(w):
    """Quantize with torch, cross-check against numpy bit for bit; return (qweight, scales, deq, q)."""
    q, s16, deq = quantize_torch(w)
    qn, sn = quantize_numpy(w.detach().to(torch.float32).numpy())
    if not np.array_equal(q.numpy(), qn):
        raise SystemExit("quantizer mismatch torch vs numpy (q)")
    if not np.array_equal(s16.numpy().view(np.uint16), sn.view(np.uint16)):
        raise SystemExit("quantizer mismatch torch vs numpy (scales)")
    qw = pack_torch(q)
    if not np.array_equal(qw.numpy(), pack_numpy(q.numpy())):
        raise SystemExit("packing mismatch torch vs numpy")
    if not torch.equal(unpack_torch(qw, w.shape[1]), q):
        raise SystemExit("pack/unpack round trip failed")
    return qw, s16.contiguous(), deq, q


# ---------------------------------------------------------------------------------------------
# Edge cases of the quantizer
# ---------------------------------------------------------------------------------------------

def f32(x):
    return float(torch.tensor(x, dtype=torch.float32))


def s16_of(m):
    m = torch.tensor([abs(f32(m))], dtype=torch.float32)
    return float((m / torch.full_like(m, 7.0)).to(torch.float16).to(torch.float32))


def fill_group(gen, m, pos):
    """32 f32 values with |v| < |m| and the value m at index pos."""
    u = (torch.rand(GROUP, generator=gen, dtype=torch.float64) * 2 - 1) * 0.999 * abs(f32(m))
    v = [f32(x) for x in u.tolist()]
    v[pos] = f32(m)
    return v


def tie_group(gen, m, pos, checks):
    """A group whose max is m and whose other entries hit w/s == k + 0.5 exactly (after the f16
    rounding of s); where s is a power of two, also w/s == 0.5 - 2^-25 (the largest f32 below
    0.5), which an f32 floor(|x| + 0.5) wrongly rounds to 1. checks collects (idx, expected q)."""
    s = s16_of(m)
    v = fill_group(gen, m, pos)
    slots = [i for i in range(GROUP) if i != pos]
    vals = []
    for k in range(-7, 7):
        t = (k + 0.5) * s
        if s > 0 and abs(t) <= abs(f32(m)) and f32(t) == t:
            vals.append((t, k + 1 if k >= 0 else k))       # away from zero
    if s > 0 and (s == 2.0 ** round(np.log2(s))):
        e = 0.5 - 2.0 ** -25
        for sign in (1, -1):
            t = sign * e * s
            if f32(t) == t:
                vals.append((t, 0))
    for (t, qexp), i in zip(vals, slots):
        v[i] = t
        checks.append((i, qexp))
    return v


def build_quant_cases(seed=777):
    gen = torch.Generator().manual_seed(seed)
    cases = {}
    notes = {}
    expected = {}   # case -> list of (row, col, q) to self-check

    def assemble(name, groups, per_row, note, checks=None):
        rows = [sum(groups[r * per_row:(r + 1) * per_row], []) for r in range(len(groups) // per_row)]
        cases[name] = torch.tensor(rows, dtype=torch.float32)
        notes[name] = note
        if checks:
            expected[name] = checks

    def normal(std):
        return [f32(x) for x in (torch.randn(GROUP, generator=gen, dtype=torch.float64) * std).tolist()]

    # case0: zero groups, negative zeros, a lone nonzero
    single = [0.0] * GROUP
    single[5] = 3.0
    g0 = [[0.0] * GROUP, normal(1.0), normal(1.0), [0.0] * GROUP, [0.0] * GROUP, [0.0] * GROUP,
          [-0.0] * GROUP, single]
    assemble("case0", g0, 2, "[4,64] all-zero groups (s=0 -> q=0, nibble 8), -0.0 group, lone nonzero")

    # case1: exact x.5 quotients after f16 rounding of s, both signs; max element positive/negative
    ms = [7.0, 1.75, 1.0, -1.0, 5.0, -5.0, 0.3, 100.0, 0.4375, 3.0, 6.0, 0.6, 1e3, 7 * 2.0 ** -20, 1e-6]
    groups, checks = [], []
    for gi, m in enumerate(ms):
        c = []
        groups.append(tie_group(gen, m, (gi * 7) % GROUP, c))
        row, gcol = divmod(gi, 3)
        checks += [(row, gcol * GROUP + i, q) for i, q in c]
    assemble("case1", groups, 3, "[5,96] w/s == k+0.5 exactly (half away from zero), incl. 0.5-2^-25 "
             "and subnormal/rounded scales", checks)

    # case2: scale rounding: RNE ties in f16 (down/up), plain up/down, subnormal, underflow to 0
    ms = [7 * (1 + 2.0 ** -11), 7 * (1 + 3 * 2.0 ** -11), -7 * (1 + 2.0 ** -11), 1.0, 5.0,
          7 * 2.0 ** -20, 1e-6, 7 * 2.5 * 2.0 ** -24, 7 * 3.5 * 2.0 ** -24, 7 * 0.5 * 2.0 ** -24,
          1e-8, 7 * 0.75 * 2.0 ** -24]
    groups = [fill_group(gen, m, (gi * 11 + 3) % GROUP) for gi, m in enumerate(ms)]
    assemble("case2", groups, 2, "[6,64] s rounding: f16 ties to even (down, up), rounds up/down, "
             "subnormal s, s underflowing to 0 with nonzero w (q=0)")

    # case3: large magnitudes
    ms = [1e3, -1e3, 3e4, -3e5, 4.5e5, 1234.5678, 65504.0, -7e3, 2.5e5, 1e4, -1e2, 5e5 * 0.9]
    groups = [fill_group(gen, m, (gi * 5 + 1) % GROUP) for gi, m in enumerate(ms)]
    assemble("case3", groups, 3, "[4,96] large magnitudes (1e2..4.5e5, s up to ~6.4e4)")

    # case4: random normal rows
    rows = torch.cat([torch.randn(8, 64, generator=gen) * 1.0, torch.randn(8, 64, generator=gen) * 0.02])
    cases["case4"] = rows.to(torch.float32)
    notes["case4"] = "[16,64] random normal, std 1 (rows 0-7) and 0.02 (rows 8-15)"

    bf = torch.cat([torch.randn(4, 64, generator=gen) * 0.05, torch.randn(4, 64, generator=gen) * 1.0])
    bf16 = bf.to(torch.bfloat16)
    return cases, notes, expected, bf16


def write_quant_cases(path):
    cases, notes, expected, bf16 = build_quant_cases()
    tensors = {}
    stats = {}
    for name, w in cases.items():
        qw, s16, _, q = quantize_checked(w)
        for (r, c, qexp) in expected.get(name, []):
            if int(q[r, c]) != qexp:
                raise SystemExit(f"{name}[{r},{c}]: q={int(q[r, c])}, expected {qexp}")
        tensors[f"{name}.w"] = w.contiguous()
        tensors[f"{name}.qweight"] = qw
        tensors[f"{name}.scales"] = s16
        stats[name] = dict(shape=list(w.shape), zero_scales=int((s16 == 0).sum()),
                           subnormal_scales=int(((s16 != 0) & (s16.abs() < 2.0 ** -14)).sum()),
                           clamped_to_7=int((q == 7).sum()), q_min=int(q.min()), q_max=int(q.max()))
    qw, s16, _, q = quantize_checked(bf16)
    tensors["bf16case.w"] = bf16.contiguous()
    tensors["bf16case.qweight"] = qw
    tensors["bf16case.scales"] = s16
    notes["bf16case"] = "[8,64] bf16 weights; the scheme uses their exact f32 values"
    # where an f32 floor(|x|+0.5) would differ from the exact rounding
    x = torch.tensor([0.5 - 2.0 ** -25], dtype=torch.float32)
    naive = float(torch.floor(x.abs() + 0.5))
    log(f"quant_cases: f32 floor(|x|+0.5) at x=0.5-2^-25 gives {naive:g}; exact rounding gives 0")
    meta = {"scheme": "int4 per-row groups, CONTRACTS.md section 2", "group_size": str(GROUP)}
    meta.update({k: v for k, v in notes.items()})
    save_file(tensors, path, metadata=meta)
    for k, v in stats.items():
        log(f"quant_cases {k}: {v}  -- {notes[k]}")
    # a few scale facts for the log
    for m in [7 * (1 + 2.0 ** -11), 7 * (1 + 3 * 2.0 ** -11), 1.0, 5.0, 1e-6, 7 * 2.5 * 2.0 ** -24,
              7 * 3.5 * 2.0 ** -24, 7 * 0.5 * 2.0 ** -24, 1e-8]:
        log(f"  m={f32(m)!r}: m/7={f32(m) / 7!r} -> s16={s16_of(m)!r}")


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

def make_config(c, init_range):
    kw = dict(c)
    theta = float(kw.pop("rope_theta"))
    common = dict(attention_bias=False, use_sliding_window=False, hidden_act="silu",
                  initializer_range=init_range, attention_dropout=0.0)
    try:
        cfg = Qwen3Config(**kw, **common, rope_parameters={"rope_type": "default", "rope_theta": theta})
    except TypeError as e:   # transformers 4.x
        log("Qwen3Config(rope_parameters=...) refused, using rope_theta:", e)
        cfg = Qwen3Config(**kw, **common, rope_theta=theta)
    rp = getattr(cfg, "rope_parameters", None)
    got = rp.get("rope_theta") if isinstance(rp, dict) else getattr(cfg, "rope_theta", None)
    assert float(got) == theta, (got, theta)
    assert not getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None) is None
    assert cfg.head_dim == c["head_dim"] and cfg.tie_word_embeddings == c["tie_word_embeddings"]
    return cfg


def build_and_save(name, spec, seed, d):
    cfg = make_config(spec["cfg"], spec["init_range"])
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters(), key=lambda t: t[0]):
            if p.ndim == 2:
                p.copy_(torch.randn(tuple(p.shape), generator=gen) * spec["init_range"])
            elif p.ndim == 1 and pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(tuple(p.shape), generator=gen))
            else:
                raise SystemExit(f"unexpected parameter {pname} {tuple(p.shape)}")
    if cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        log(f"WARNING {name}: lm_head not tied after construction; calling tie_weights()")
        model.tie_weights()
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            log(f"WARNING {name}: still not tied; copying the embedding into lm_head")
            with torch.no_grad():
                model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    model = model.to(torch.bfloat16)
    if os.path.exists(d):
        shutil.rmtree(d)
    kw = {}
    if spec["shard"]:
        kw["max_shard_size"] = spec["shard"]
    try:
        model.save_pretrained(d, safe_serialization=True, **kw)
    except Exception as e:  # noqa: BLE001 -- safe_serialization gone in a later version
        log(f"save_pretrained(safe_serialization=True) failed ({e!r}); retrying without it")
        shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(d, **kw)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    return d


def read_checkpoint(d):
    """All tensors of the saved checkpoint (single file or shards), as stored."""
    idx = os.path.join(d, "model.safetensors.index.json")
    files = []
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        out.update(load_file(os.path.join(d, fn)))
    return out, files


def load_oracle(d):
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    assert next(model.parameters()).dtype == torch.float32
    return model


@torch.no_grad()
def last_logits(model, ids):
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0, -1].to(torch.float32)


@torch.no_grad()
def greedy_case(model, prompt):
    ids = list(prompt)
    first = None
    toks, margins, maxabs = [], [], []
    for _ in range(N_GREEDY):
        lg = last_logits(model, ids)
        if first is None:
            first = lg.clone()
        top = torch.topk(lg, 2)
        t = int(torch.argmax(lg))
        toks.append(t)
        margins.append(float(top.values[0] - top.values[1]))
        maxabs.append(float(lg.abs().max()))
        ids.append(t)
    return first, toks, margins, maxabs


def int4_model(model, ckpt):
    """A copy of model whose 2-D weights are int4 quantize-dequantized (tied head follows the
    quantized embedding); returns (model, {name: (qweight, scales)})."""
    m4 = copy.deepcopy(model)
    packed = {}
    names = set()
    with torch.no_grad():
        for pname, p in m4.named_parameters():
            if p.ndim != 2:
                continue
            if pname not in ckpt:
                raise SystemExit(f"parameter {pname} not in checkpoint (keys: {sorted(ckpt)[:5]}...)")
            src = ckpt[pname]
            assert torch.equal(src.to(torch.float32), p), f"{pname}: loaded f32 != saved bf16"
            qw, s16, deq, _ = quantize_checked(src)
            p.copy_(deq)
            packed[pname] = (qw, s16)
            names.add(pname)
    two_d = {k for k, v in ckpt.items() if v.ndim == 2
             and not (m4.config.tie_word_embeddings and k == "lm_head.weight")}
    assert names == two_d, (sorted(names ^ two_d))
    if m4.config.tie_word_embeddings:
        assert m4.lm_head.weight.data_ptr() == m4.model.embed_tokens.weight.data_ptr()
    else:
        assert "lm_head.weight" in names
    return m4, packed


def run_model(name, spec, out_root):
    d = os.path.join(out_root, name)
    attempts = []
    chosen = None
    for a in range(MAX_SEED_ATTEMPTS):
        seed = spec["seed"] + a
        build_and_save(name, spec, seed, d)
        ckpt, files = read_checkpoint(d)
        model = load_oracle(d)
        cfg = model.config
        tied = bool(cfg.tie_word_embeddings)
        # every weight of the oracle equals the saved bf16 value
        sd = dict(model.named_parameters())
        for k, v in ckpt.items():
            if tied and k == "lm_head.weight":
                continue
            assert k in sd, f"{k} in file but not a parameter"
            assert torch.equal(sd[k], v.to(torch.float32)), k
        for k in sd:
            assert k in ckpt, f"parameter {k} missing from file"
        log(f"{name}: files {files}; dtypes {sorted(set(str(v.dtype) for v in ckpt.values()))}; "
            f"{len(ckpt)} tensors")
        if spec["shard"]:
            assert len(files) >= 2, files
        if tied:
            if "lm_head.weight" in ckpt:
                log(f"WARNING {name}: tied checkpoint holds lm_head.weight "
                    f"(equal to embed: {torch.equal(ckpt['lm_head.weight'], ckpt['model.embed_tokens.weight'])})")
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        else:
            assert "lm_head.weight" in ckpt
            assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
        pg = torch.Generator().manual_seed(spec["seed"] + 12345)
        prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=pg).tolist() for n in spec["prompt_lens"]]
        variants = {"dense": (model, None)}
        if "int4" in spec["variants"]:
            variants["int4"] = int4_model(model, ckpt)
        cases = []
        near = 0
        for pr in prompts:
            for wname in spec["variants"]:
                m, _ = variants[wname]
                first, toks, margins, maxabs = greedy_case(m, pr)
                rel = [mg / mx for mg, mx in zip(margins, maxabs)]
                n_near = sum(r < MARGIN_REL for r in rel)
                near += n_near
                cases.append({"weights": wname, "prompt": pr,
                              "last_logits": [float(x) for x in first.tolist()],
                              "greedy": toks, "margins": margins, "max_abs_logits": maxabs})
                log(f"  {name} seed={seed} {wname:5s} prompt_len={len(pr):3d} greedy={toks}")
                log(f"      max|logit| {min(maxabs):.3f}..{max(maxabs):.3f}  logit std(step0) "
                    f"{float(first.std()):.3f}  min margin/max {min(rel):.2e}  near-ties {n_near}")
        # dense vs int4 agreement, for the record
        if "int4" in spec["variants"]:
            for i in range(0, len(cases), 2):
                a_, b_ = cases[i], cases[i + 1]
                la, lb = torch.tensor(a_["last_logits"]), torch.tensor(b_["last_logits"])
                same = sum(x == y for x, y in zip(a_["greedy"], b_["greedy"]))
                log(f"      dense vs int4 prompt_len={len(a_['prompt'])}: max|dlogit|/max|logit| "
                    f"{float((la - lb).abs().max() / la.abs().max()):.3e}; greedy equal at {same}/16 steps")
        steps = len(cases) * N_GREEDY
        attempts.append(dict(seed=seed, near_ties=near, steps=steps,
                             rel=[mg / mx for c in cases for mg, mx in zip(c["margins"], c["max_abs_logits"])]))
        log(f"{name}: seed {seed}: {near} of {steps} greedy steps with margin < {MARGIN_REL}*max|logit|")
        chosen = (seed, cases, variants, ckpt, files)
        if near == 0:
            break
    seed, cases, variants, ckpt, files = chosen
    golden = {"model": name, "transformers_version": transformers.__version__,
              "torch_version": str(torch.__version__), "group_size": GROUP, "cases": cases}
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    if name == "tied":
        packed = variants["int4"][1]
        t = {}
        for k in sorted(packed):
            t[k + ".qweight"], t[k + ".scales"] = packed[k]
        save_file(t, os.path.join(d, "int4_expected.safetensors"),
                  metadata={"scheme": "int4 per-row groups, CONTRACTS.md section 2",
                            "group_size": str(GROUP), "qweight": "u32 words stored as int32",
                            "source": "model.safetensors (bf16) of this folder"})
    all_rel = [r for a in attempts for r in a["rel"]]
    log(f"{name}: chose seed {seed} after {len(attempts)} attempt(s); files {files}")
    log(f"{name}: over all attempts, {sum(r < MARGIN_REL for r in all_rel)} of {len(all_rel)} steps near-tie; "
        f"min margin/max|logit| {min(all_rel):.3e}; median {float(np.median(all_rel)):.3e}")
    final_rel = attempts[-1]["rel"]
    log(f"{name}: chosen seed: min margin/max|logit| {min(final_rel):.3e}, "
        f"steps below 1e-2: {sum(r < 1e-2 for r in final_rel)} of {len(final_rel)}")
    with open(os.path.join(d, "config.json")) as f:
        log(f"{name}: config.json:\n{f.read()}")
    return dict(seed=seed, attempts=[(a["seed"], a["near_ties"], a["steps"]) for a in attempts])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--no-newuser", action="store_true", help="skip the sharded newuser checkpoint")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    log(f"python {sys.version.split()[0]} torch {torch.__version__} transformers {transformers.__version__} "
        f"numpy {np.__version__}")
    write_quant_cases(os.path.join(args.out, "quant_cases.safetensors"))
    summary = {}
    for name, spec in MODELS.items():
        if name == "newuser" and args.no_newuser:
            continue
        summary[name] = run_model(name, spec, args.out)
    log("summary:", json.dumps(summary))
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for root, _, fns in sorted(os.walk(args.out)):
        for fn in sorted(fns):
            p = os.path.join(root, fn)
            log(f"  {os.path.getsize(p):9d}  {os.path.relpath(p, args.out)}")
    log(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
