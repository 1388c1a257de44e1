"""Shared pieces of webdraft's training recipe: the two model shapes, the
Qwen3 tokenizer shipped in the repo, the token data on disk, the int4 scheme
of docs/reference.md, "The int4 scheme" (exact, and as fake quantization for QAT), and a reader
for the int4 folders `webdraft convert` writes.

Everything here runs on the GPU machine (torch 2.11, transformers 5.17,
tokenizers 0.23, safetensors); see README.md for the order of the stages.
"""
import gzip
import json
import os
import time

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VOCAB = 151936

# The shipped pair: both Qwen3 with the real tokenizer and the full
# vocabulary; every matrix width a multiple of the int4 group size (32).
# The tied 151,936-row embedding dominates the bytes (int4: hidden/2 +
# hidden/16 bytes a row: 21.9 MB at hidden 256) and is stored once: the
# drafter has the target's width and uses its embedding, frozen while it
# trains (EAGLE's drafters do the same), and its head scores only the most
# used tokens (FR-Spec). What the 40 MiB budget leaves goes into depth, at
# 0.55 MB a layer: the target 16 layers (30.7 MB in int4), the drafter 2
# (1.1 MB, and the list of its head's tokens).
SHAPES = {
    "target": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=16,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "drafter": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}
EMBED = "model.embed_tokens.weight"
HEAD_TOKENS = "lm_head.token_ids"  # webdraft's name for the tokens a partial head scores
MAX_POSITIONS = 2048


def config(role):
    return Qwen3Config(vocab_size=VOCAB, max_position_embeddings=MAX_POSITIONS, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.02,
                       **SHAPES[role])


def new_model(role, device):
    with torch.device(device):
        return Qwen3ForCausalLM(config(role))


def tokenizer():
    """The Qwen3 tokenizer webdraft embeds (tokenizer/qwen3/tokenizer.json.gz)."""
    from tokenizers import Tokenizer
    with gzip.open(os.path.join(REPO, "tokenizer", "qwen3", "tokenizer.json.gz"), "rb") as f:
        return Tokenizer.from_str(f.read().decode("utf-8"))


def tokens(data_dir, split):
    """The token ids of a split as a read-only uint32 memmap."""
    return np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint32, mode="r")


def batches(ids, batch, seq, seed):
    """Random windows of seq+1 tokens, forever: (inputs, labels) pairs."""
    rng = np.random.default_rng(seed)
    n = len(ids) - seq - 1
    while True:
        starts = rng.integers(0, n, size=batch)
        w = np.stack([ids[s:s + seq + 1] for s in starts]).astype(np.int64)
        yield torch.from_numpy(w)


# --- the int4 scheme of docs/reference.md ("The int4 scheme") -------------

def int4_scales(w, group=32):
    """s = f16(max|w| / 7) per row and group, as f32: (out, in/G)."""
    g = w.float().reshape(w.shape[0], -1, group)
    return (g.abs().amax(dim=-1) / 7).to(torch.float16).to(torch.float32)


def int4_codes(w, s, group=32):
    """q = clamp(round_half_away(w / s), -8, 7), 0 where s == 0: (out, in)."""
    g = w.float().reshape(w.shape[0], -1, group)
    x = g / s.unsqueeze(-1).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.sign(x) * torch.floor(torch.abs(x.double()) + 0.5).float()
    q = torch.where(s.unsqueeze(-1) == 0, torch.zeros_like(q), q.clamp(-8, 7))
    return q.reshape(w.shape)


def int4_dequant(w, group=32):
    s = int4_scales(w, group)
    q = int4_codes(w, s, group)
    return (q.reshape(w.shape[0], -1, group) * s.unsqueeze(-1)).reshape(w.shape)


def fake_int4(w, group=32):
    """Quantize-dequantize in the forward pass, identity in the backward
    (straight-through estimator): quantization-aware training."""
    return w + (int4_dequant(w.detach(), group).to(w.dtype) - w).detach()


def enable_qat(model, group=32):
    """Routes every linear layer and the embedding (and so the tied head)
    through fake_int4, exactly the matrices webdraft quantizes; a frozen
    embedding (share_embedding: int4 values already) stays as it is."""
    import torch.nn.functional as F

    for mod in model.modules():
        weight = getattr(mod, "weight", None)
        if isinstance(weight, torch.Tensor) and not weight.requires_grad:
            continue
        if isinstance(mod, torch.nn.Linear):
            mod.forward = (lambda m: lambda x: F.linear(x, fake_int4(m.weight, group), m.bias))(mod)
        elif isinstance(mod, torch.nn.Embedding):
            mod.forward = (lambda m: lambda ids: F.embedding(ids, fake_int4(m.weight, group)))(mod)


def is_webdraft(folder):
    """Whether a folder holds a webdraft model.safetensors."""
    from safetensors import safe_open

    path = os.path.join(folder, "model.safetensors")
    if not os.path.exists(path):
        return False
    with safe_open(path, framework="pt") as f:
        return (f.metadata() or {}).get("format") == "webdraft"


def load_webdraft_int4(folder, device):
    """A Qwen3ForCausalLM holding the dequantized weights of a folder written
    by `webdraft convert --quant int4` (what webdraft itself runs)."""
    from safetensors import safe_open

    cfg = Qwen3Config.from_pretrained(folder)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    state = {}
    with safe_open(os.path.join(folder, "model.safetensors"), framework="pt") as f:
        meta = f.metadata()
        assert meta.get("format") == "webdraft" and meta.get("quant") == "int4", meta
        group = int(meta["group_size"])
        for name in f.keys():
            t = f.get_tensor(name)
            if name.endswith(".qweight"):
                words = t.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
                nib = torch.stack([(words >> (4 * j)) & 15 for j in range(8)], dim=-1)
                q = (nib.reshape(words.shape[0], -1) - 8).float()
                s = f.get_tensor(name[:-len(".qweight")] + ".scales").float()
                w = (q.reshape(q.shape[0], -1, group) * s.unsqueeze(-1)).reshape(q.shape)
                state[name[:-len(".qweight")]] = w
            elif not name.endswith(".scales"):
                state[name] = t.float()
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]  # tied
    assert not missing and not unexpected, (missing, unexpected)
    model.tie_weights()
    return model.to(device)


def int4_embedding(folder):
    """The embedding of a webdraft int4 folder, dequantized (f32): exactly
    the values webdraft computes with."""
    from safetensors import safe_open

    with safe_open(os.path.join(folder, "model.safetensors"), framework="pt") as f:
        meta = f.metadata()
        assert meta.get("format") == "webdraft" and meta.get("quant") == "int4", meta
        group = int(meta["group_size"])
        words = f.get_tensor(EMBED + ".qweight").view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        scales = f.get_tensor(EMBED + ".scales").float()
    nib = torch.stack([(words >> (4 * j)) & 15 for j in range(8)], dim=-1)
    q = (nib.reshape(words.shape[0], -1) - 8).float()
    return (q.reshape(q.shape[0], -1, group) * scales.unsqueeze(-1)).reshape(q.shape)


def share_embedding(model, target):
    """Gives the model the embedding of the target's webdraft int4 folder,
    as webdraft runs it, and freezes it (with tied weights the head too):
    the drafter then ships without an embedding of its own. enable_qat
    leaves it alone, since it already holds int4 values."""
    embed = int4_embedding(target)
    weight = model.model.embed_tokens.weight
    assert weight.shape == embed.shape, (weight.shape, embed.shape)
    with torch.no_grad():
        weight.copy_(embed.to(weight.device, weight.dtype))
    weight.requires_grad_(False)


def share_embedding_check(model, target):
    """Asserts that the model's embedding is still the target's, bit for bit."""
    got = model.model.embed_tokens.weight.detach().float().cpu()
    assert torch.equal(got, int4_embedding(target)), "the embedding moved: it must stay the one of " + target


def ranked_tokens(data_dir):
    """The token ids the training corpus uses, most frequent first (ties by
    id): the order a partial head (`webdraft convert --head-tokens N`)
    keeps the first N of."""
    counts = np.load(os.path.join(data_dir, "token_counts.npy"))
    order = np.argsort(-counts.astype(np.int64), kind="stable")
    return order[counts[order] > 0].astype(np.int32)


def export_shared(model, out_dir, target, data_dir):
    """Writes a drafter trained on the target's frozen embedding as webdraft
    convert takes it with --embedding-from: config.json and a
    model.safetensors of every tensor but the embedding (and its tied head),
    plus lm_head.token_ids, the corpus's tokens ranked by frequency."""
    from safetensors.torch import save_file

    share_embedding_check(model, target)
    os.makedirs(out_dir, exist_ok=True)
    model.config.save_pretrained(out_dir)
    tensors = {k: v.detach().float().contiguous().cpu() for k, v in model.state_dict().items()
               if k not in (EMBED, "lm_head.weight")}
    tensors[HEAD_TOKENS] = torch.from_numpy(ranked_tokens(data_dir))
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


class Deadline:
    """A wall-clock budget: stages stop (and save) before the GPU machine's
    10-minute limit."""

    def __init__(self, minutes):
        self.end = time.time() + 60 * minutes

    def left(self):
        return self.end - time.time()


def log(**kv):
    print(json.dumps(kv), flush=True)
