#!/usr/bin/env python3
"""A tiny random EAGLE-3 head in the public checkpoint layout, and its
forward pass in PyTorch as SGLang's and vLLM's llama_eagle3.py compute it,
for webdraft's plain-Go head (reference/eagle3_test.go).

Usage:  python3 testdata/eagle3/make_head.py [--out testdata/eagle3/tiny]

Writes config.json and model.safetensors (LlamaForCausalLMEagle3: fc,
midlayer.*, norm, lm_head in BF16, embed_tokens, d2t as int64, t2d), and
expected.safetensors: the inputs (token ids, the target features of the
first pass) and, for a first pass of 5 rows and two later draft steps that
feed back the layer's output before norm, each row's draft-vocabulary
logits and that output. The forward runs in f32 on the BF16 weights; needs
torch (1.13 or later) and numpy; deterministic.
"""

import argparse
import json
import os

import numpy as np
import torch


def save_file(tensors, path):
    """Writes a safetensors file: name -> (dtype, numpy array of its bytes' layout)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))

CFG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "max_position_embeddings": 256,
    "vocab_size": 300,
    "draft_vocab_size": 40,
    "target_hidden_size": 48,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    # x (T, heads, D); rotate-half (neox) RoPE at positions pos (T)
    D = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2).float() / D))
    freqs = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Head:
    def __init__(self, w, c):
        self.w, self.c = w, c
        self.k = torch.zeros(0, c["num_key_value_heads"], c["head_dim"])
        self.v = torch.zeros(0, c["num_key_value_heads"], c["head_dim"])

    def forward(self, ids, hidden):
        """ids (T) target tokens, hidden (T, 3Ht) or (T, H); returns logits (T, Vd), the output before norm (T, H)."""
        w, c = self.w, self.c
        eps, H = c["rms_norm_eps"], c["hidden_size"]
        nH, nKV, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        embeds = w["embed_tokens.weight"][ids]
        if hidden.shape[-1] != H:
            hidden = hidden @ w["fc.weight"].T
        residual = hidden
        x = torch.cat([rms(embeds, w["midlayer.input_layernorm.weight"], eps), rms(hidden, w["midlayer.hidden_norm.weight"], eps)], -1)
        T = x.shape[0]
        P = self.k.shape[0]
        pos = torch.arange(P, P + T)
        q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(T, nH, D)
        k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(T, nKV, D)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(T, nKV, D)
        q, k = rope(q, pos, c["rope_theta"]), rope(k, pos, c["rope_theta"])
        self.k, self.v = torch.cat([self.k, k]), torch.cat([self.v, v])
        kk = self.k.repeat_interleave(nH // nKV, dim=1)  # (P+T, nH, D)
        vv = self.v.repeat_interleave(nH // nKV, dim=1)
        scores = torch.einsum("thd,shd->hts", q, kk) / D**0.5
        mask = torch.arange(P + T)[None, :] > pos[:, None]  # a row sees the positions up to its own
        scores = scores.masked_fill(mask[None], float("-inf"))
        attn = torch.einsum("hts,shd->thd", scores.softmax(-1), vv).reshape(T, nH * D)
        residual = residual + attn @ w["midlayer.self_attn.o_proj.weight"].T
        y = rms(residual, w["midlayer.post_attention_layernorm.weight"], eps)
        m = (torch.nn.functional.silu(y @ w["midlayer.mlp.gate_proj.weight"].T) * (y @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
        out = m + residual
        return rms(out, w["norm.weight"], eps) @ w["lm_head.weight"].T, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny"))
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(3)
    c = CFG
    H, Ht, I = c["hidden_size"], c["target_hidden_size"], c["intermediate_size"]
    qd, kvd = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    V, Vd = c["vocab_size"], c["draft_vocab_size"]
    shapes = {
        "fc.weight": (H, 3 * Ht),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (qd, 2 * H),
        "midlayer.self_attn.k_proj.weight": (kvd, 2 * H),
        "midlayer.self_attn.v_proj.weight": (kvd, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, qd),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mlp.gate_proj.weight": (I, H),
        "midlayer.mlp.up_proj.weight": (I, H),
        "midlayer.mlp.down_proj.weight": (H, I),
        "norm.weight": (H,),
        "lm_head.weight": (Vd, H),
        "embed_tokens.weight": (V, H),
    }
    w = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            t = 1 + 0.1 * torch.randn(shape)
        else:
            t = torch.randn(shape) / shape[1] ** 0.5
        w[name] = t.to(torch.bfloat16).float()  # stored as BF16; computed in f32
    used = torch.sort(torch.randperm(V)[:Vd]).values
    d2t = used - torch.arange(Vd)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True

    bf16 = lambda t: t.to(torch.bfloat16).view(torch.int16).numpy()  # noqa: E731
    tensors = {n: ("BF16", bf16(w[n])) for n in shapes}
    tensors["d2t"] = ("I64", d2t.numpy().astype(np.int64))
    tensors["t2d"] = ("BOOL", t2d.numpy().astype(np.uint8))
    save_file(tensors, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")

    head = Head(w, c)
    ids0 = torch.randint(0, V, (5,))
    feats = torch.randn(5, 3 * Ht)
    logits0, hid0 = head.forward(ids0, feats)
    expected = {"ids0": ids0.numpy().astype(np.int64), "features0": feats.numpy(), "logits0": logits0.numpy(), "hidden0": hid0.numpy()}
    hid, logits = hid0[-1:], logits0[-1:]
    for step in (1, 2):
        tok = used[logits[0].argmax()].reshape(1)  # the draft's best token, in the target's vocabulary
        logits, hid = head.forward(tok, hid)
        expected[f"ids{step}"] = tok.numpy().astype(np.int64)
        expected[f"logits{step}"] = logits.numpy()
        expected[f"hidden{step}"] = hid.numpy()
    kinds = {np.dtype(np.int64): "I64", np.dtype(np.float32): "F32"}
    save_file({k: (kinds[v.dtype], v) for k, v in expected.items()}, os.path.join(out, "expected.safetensors"))
    print(f"wrote {out}: draft tokens {[int(expected[f'ids{s}'][0]) for s in (1, 2)]}")


if __name__ == "__main__":
    main()
