#!/usr/bin/env python3
"""Stage 8: an EAGLE-3 draft head for the shipped target.

The head (LlamaForCausalLMEagle3, the layout SGLang and vLLM load) reads the
target's residual stream entering three of its layers (2, L/2 and L-3, the
engines' default), fused by `fc`, and runs one decoder layer whose q/k/v take
[input_layernorm(embedding); hidden_norm(feature)]; its `lm_head` scores the
drafter's draft vocabulary (the shipped drafter's `lm_head.token_ids`, the
32,768 tokens the corpus uses most), mapped to the target's ids by `d2t`.
The embedding is the target's int4 one, frozen and not shipped.

Training follows EAGLE-3's training-time test: over the target's greedy
continuations (distill_data.py), each sequence's rows are run --ttt times —
step 0 on the target's features, each later step on the head's own output
of the step before at the same row, the token fed being the next one of the
text (what drafting feeds once the draft so far was right) — each step's
queries attending to step 0's keys causally and to the earlier steps' keys
of their own row, with RoPE at the position the row drafts. The loss is the
cross-entropy from the target's next-token distribution over the draft
vocabulary (renormalized), step j weighted 0.8^j. The last --qat-frac of
the steps route every matrix through the int4 scheme as fake quantization
(common.fake_int4): the head is exported as webdraft's int4 folder, whose
codes are exactly those.

Evaluation, on 1,024 held-out continuations: each step's argmax agreement
with the target's greedy token, and the greedy chain's mean acceptance
length τ at k = 1 … --ttt from every start row of the continuations (a
chain's inputs are the text's tokens, which are the drafted ones as long as
the draft agrees, so this is what greedy drafting would accept).

    python3 weights/train/train_eagle3.py --target weights/target --drafter weights/drafter \
        --data /tmp/pair/data --out /tmp/pair/head --minutes 5 [--init HEAD]

(--init goes on from a head this script wrote, as another session's cycle.)

Writes OUT/config.json and OUT/model.safetensors (webdraft int4 folder of
the head: `webdraft --model weights/target --head OUT`) and OUT/eval.json.
"""
import argparse
import contextlib
import glob
import json
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import common


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Head(nn.Module):
    """LlamaForCausalLMEagle3 with one midlayer; names as the public checkpoints'."""

    def __init__(self, cfg):
        super().__init__()
        H, Ht, I = cfg["hidden_size"], cfg["target_hidden_size"], cfg["intermediate_size"]
        self.heads, self.kv, self.D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        eps = cfg["rms_norm_eps"]
        self.fc = nn.Linear(3 * Ht, H, bias=False)
        self.midlayer = nn.Module()
        m = self.midlayer
        m.input_layernorm, m.hidden_norm, m.post_attention_layernorm = RMSNorm(H, eps), RMSNorm(H, eps), RMSNorm(H, eps)
        m.self_attn = nn.Module()
        a = m.self_attn
        a.q_proj = nn.Linear(2 * H, self.heads * self.D, bias=False)
        a.k_proj = nn.Linear(2 * H, self.kv * self.D, bias=False)
        a.v_proj = nn.Linear(2 * H, self.kv * self.D, bias=False)
        a.o_proj = nn.Linear(self.heads * self.D, H, bias=False)
        m.mlp = nn.Module()
        m.mlp.gate_proj = nn.Linear(H, I, bias=False)
        m.mlp.up_proj = nn.Linear(H, I, bias=False)
        m.mlp.down_proj = nn.Linear(I, H, bias=False)
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, cfg["draft_vocab_size"], bias=False)
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, self.D, 2, dtype=torch.float64) / self.D))
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def rope(self, x, pos):
        """x (B, h, n, D) rotated at positions pos (n,): rotate-half RoPE."""
        ang = pos.float()[:, None] * self.inv_freq[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        return x * ang.cos() + rotate_half(x) * ang.sin()

    def ttt(self, emb, feats, steps):
        """emb (B, n+steps, H): the embeddings of tokens 1 … (row i's token at
        step j is emb[:, i + j]); feats (B, n, 3Ht): the target's features of
        rows 0 … n-1. Returns each step's (B, n, Vd) logits."""
        B, n = feats.shape[:2]
        m, a = self.midlayer, self.midlayer.self_attn
        x = self.fc(feats)
        rows = torch.arange(n, device=feats.device)
        causal = rows[None, :] <= rows[:, None]  # (n queries, n keys)
        g = self.heads // self.kv
        keys, values, out = [], [], []
        for j in range(steps):
            residual = x
            h = torch.cat([m.input_layernorm(emb[:, j:j + n]), m.hidden_norm(x)], dim=-1)
            q = a.q_proj(h).view(B, n, self.heads, self.D).transpose(1, 2)
            k = a.k_proj(h).view(B, n, self.kv, self.D).transpose(1, 2)
            v = a.v_proj(h).view(B, n, self.kv, self.D).transpose(1, 2)
            q, k = self.rope(q, rows + j), self.rope(k, rows + j)
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
            keys.append(k)
            values.append(v)
            scale = 1 / math.sqrt(self.D)
            s0 = (q @ keys[0].transpose(-1, -2)) * scale
            s0 = s0.masked_fill(~causal, float("-inf"))
            diag = [(q * kk).sum(-1, keepdim=True) * scale for kk in keys[1:]]
            p = torch.cat([s0] + diag, dim=-1).float().softmax(-1).to(q.dtype)
            o = p[..., :n] @ values[0]
            for s, vv in enumerate(values[1:]):
                o = o + p[..., n + s:n + s + 1] * vv
            o = o.transpose(1, 2).reshape(B, n, self.heads * self.D)
            x = residual + a.o_proj(o)
            hh = m.post_attention_layernorm(x)
            x = x + m.mlp.down_proj(F.silu(m.mlp.gate_proj(hh)) * m.mlp.up_proj(hh))
            out.append(self.lm_head(self.norm(x)))
        return out


def head_config(target_cfg, aux, vd, intermediate=0):
    """The head's config.json: the target's layer shape (its MLP
    `intermediate` wide when given), its RoPE and context;
    eagle_aux_hidden_state_layer_ids as SGLang reads them (the layer before
    each one whose input is a feature)."""
    t = target_cfg
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": t.hidden_size,
        "intermediate_size": intermediate or t.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads,
        "head_dim": t.head_dim,
        "rms_norm_eps": t.rms_norm_eps,
        "rope_theta": float(getattr(t, "rope_theta", None) or t.rope_parameters["rope_theta"]),
        "rope_scaling": None,
        "max_position_embeddings": t.max_position_embeddings,
        "vocab_size": t.vocab_size,
        "draft_vocab_size": vd,
        "target_hidden_size": t.hidden_size,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in aux]},
    }


def draft_tokens(drafter):
    """The shipped drafter's head tokens, ascending: the draft vocabulary."""
    _, tensors = read_safetensors(os.path.join(drafter, "model.safetensors"))
    return torch.sort(torch.from_numpy(tensors[common.HEAD_TOKENS].astype(np.int64))).values


def load_continuations(data):
    files = sorted(glob.glob(os.path.join(data, "distill-*.npy")))
    if not files:
        raise SystemExit(f"no distill-*.npy in {data}: run distill_data.py first")
    with open(os.path.join(data, "distill.json")) as f:
        meta = json.load(f)
    return np.concatenate([np.load(p) for p in files]), meta["prompt"]


def pack_int4(w, group=32):
    """webdraft's int4 matrix (docs/reference.md, "The int4 scheme"): the
    codes, 8 a uint32 word (code+8 in nibble j for column 8w+j), (out, in/8);
    the scales as f16, (out, in/G)."""
    s = common.int4_scales(w, group)
    q = (common.int4_codes(w, s, group) + 8).to(torch.int64).reshape(w.shape[0], -1, 8)
    words = torch.zeros(q.shape[:2], dtype=torch.int64)
    for j in range(8):
        words |= q[..., j] << (4 * j)
    return words.numpy().astype(np.uint32), s.to(torch.float16).numpy()


def save_safetensors(tensors, path, metadata):
    """A safetensors file of numpy arrays (dtypes F32, F16, U32, I64)."""
    kinds = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint32): "U32", np.dtype(np.int64): "I64"}
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {"dtype": kinds[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def export(head, cfg, tokens, out_dir):
    """The head as a webdraft int4 folder: config.json, model.safetensors
    (matrices int4, vectors f32, d2t int64)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    tensors = {}
    for name, p in head.state_dict().items():
        p = p.detach().float().cpu()
        if p.dim() == 2:
            tensors[name + ".qweight"], tensors[name + ".scales"] = pack_int4(p)
        else:
            tensors[name] = p.numpy()
    tensors["d2t"] = (tokens.cpu() - torch.arange(len(tokens))).numpy().astype(np.int64)
    meta = {"format": "webdraft", "format_version": "1", "quant": "int4", "group_size": "32"}
    save_safetensors(tensors, os.path.join(out_dir, "model.safetensors"), meta)


def read_safetensors(path):
    """A safetensors file's metadata and tensors (numpy; F32, F16, U32, I32, I64)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "F16": np.float16, "U32": np.uint32, "I32": np.int32, "I64": np.int64}
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        lo, hi = t["data_offsets"]
        out[name] = np.frombuffer(data[lo:hi], kinds[t["dtype"]]).reshape(t["shape"])
    return meta, out


def load_int4_head(head, folder):
    """Loads a head folder export() wrote, its matrices dequantized."""
    meta, tensors = read_safetensors(os.path.join(folder, "model.safetensors"))
    group = int(meta["group_size"])
    state = {}
    for name, a in tensors.items():
        if name.endswith(".qweight"):
            words = torch.from_numpy(a.astype(np.int64))
            nib = torch.stack([(words >> (4 * j)) & 15 for j in range(8)], dim=-1)
            q = (nib.reshape(words.shape[0], -1) - 8).float()
            sc = torch.from_numpy(tensors[name[:-len(".qweight")] + ".scales"].astype(np.float32))
            state[name[:-len(".qweight")]] = (q.reshape(q.shape[0], -1, group) * sc.unsqueeze(-1)).reshape(q.shape)
        elif not name.endswith(".scales") and name != "d2t":
            state[name] = torch.from_numpy(a.astype(np.float32))
    head.load_state_dict(state)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="the target's webdraft int4 folder")
    ap.add_argument("--drafter", required=True, help="the shipped drafter's folder: its head tokens are the draft vocabulary")
    ap.add_argument("--data", required=True, help="distill_data.py's continuations (distill-*.npy)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--max-steps", type=int, default=0, help="for smoke tests")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ttt", type=int, default=7, help="training-time test steps")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--qat-frac", type=float, default=0.2, help="the last fraction of the steps trains with int4 fake quantization")
    ap.add_argument("--intermediate", type=int, default=0, help="the head's MLP width (default: the target's)")
    ap.add_argument("--aux", help="the three target layers whose inputs are the features, e.g. 2,8,15 (default: 2, L/2 and L-3, the engines')")
    ap.add_argument("--init", help="a head folder this script wrote (webdraft int4): go on training it, dequantized (its width and features as its config.json says)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = args.device
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    deadline = common.Deadline(args.minutes)

    target = common.load_webdraft_int4(args.target, dev).eval().requires_grad_(False)
    tc = target.config
    L = tc.num_hidden_layers
    aux = sorted({2, L // 2, L - 3})  # the residual stream entering these layers
    if args.init:  # the head's own shape and features
        with open(os.path.join(args.init, "config.json")) as f:
            init_cfg = json.load(f)
        args.intermediate = init_cfg["intermediate_size"]
        args.aux = ",".join(str(i + 1) for i in init_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    if args.aux:
        aux = sorted({int(x) for x in args.aux.split(",")})
        if len(aux) != 3 or aux[0] < 1 or aux[2] >= L:
            raise SystemExit(f"--aux {args.aux}: want three distinct layers in 1 … {L - 1}")
    tokens = draft_tokens(args.drafter).to(dev)
    cfg = head_config(tc, aux, len(tokens), args.intermediate)
    head = Head(cfg).to(dev)
    embed = target.model.embed_tokens.weight  # int4 values, frozen
    with torch.no_grad():  # start the head's output where the target's ends
        head.lm_head.weight.copy_(target.lm_head.weight[tokens])
        head.norm.weight.copy_(target.model.norm.weight)

    if args.init:
        load_int4_head(head, args.init)
    # bf16 on the GPU: the target's passes and the head's, the losses in f32
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dev == "cuda" else contextlib.nullcontext()

    seqs, prompt_len = load_continuations(args.data)
    T = seqs.shape[1]
    n_eval = min(1024, len(seqs) // 8)
    train_n = len(seqs) - n_eval
    rng = np.random.default_rng(5)
    K = args.ttt
    n_rows = T - 1 - K  # rows whose every step has a label

    draft_head = target.lm_head.weight[tokens]  # the target's read-out rows of the draft vocabulary

    def batch_of(idx):
        """A batch's inputs: the head's embeddings, the target's features,
        its log-distribution over the draft vocabulary after each position
        (its read-out of those tokens only, renormalized), and its greedy
        token after each position — which, from the prompt's last position
        on, is the continuation's next token (the continuations are the
        target's greedy ones), so the target's full read-out is never
        computed."""
        w = torch.from_numpy(seqs[idx].astype(np.int64)).to(dev)
        with torch.no_grad(), autocast:
            out = target.model(input_ids=w, output_hidden_states=True)
            assert len(out.hidden_states) == L + 1, len(out.hidden_states)
            feats = torch.cat([out.hidden_states[i] for i in aux], dim=-1)[:, :n_rows].float()
            soft = F.linear(out.last_hidden_state, draft_head).float().log_softmax(-1)
            emb = embed[w[:, 1:1 + n_rows + K]].float()
        return emb, feats, soft, w[:, 1:]

    def losses(emb, feats, soft, greedy):
        """The training-time test's loss, and each step's agreement with the
        target's greedy token for the rows that draft inside the
        continuation (B, n_rows − prompt_len + 1)."""
        with autocast:
            outs = head.ttt(emb, feats, K)
        loss, agree = 0.0, []
        for j, lg in enumerate(outs):
            # row i at step j drafts the token after position i+1+j
            p = soft[:, 1 + j:1 + j + n_rows].exp()
            lp = lg.float().log_softmax(-1)
            loss = loss + 0.8 ** j * -(p * lp).sum(-1).mean()
            agree.append((tokens[lg.argmax(-1)] == greedy[:, 1 + j:1 + j + n_rows])[:, prompt_len - 1:])
        return loss, agree

    def evaluate():
        head.eval()
        hits = []
        with torch.no_grad():
            for s in range(train_n, len(seqs), args.batch):
                idx = np.arange(s, min(s + args.batch, len(seqs)))
                _, agree = losses(*batch_of(idx))
                # rows that start drafting inside the continuation
                hits.append(torch.stack(agree, dim=-1).reshape(-1, K).cpu())
        head.train()
        h = torch.cat(hits).float()
        run = torch.cumprod(h, dim=-1)  # 1 while every step so far agreed
        return {
            "agreement_by_step": [round(x, 4) for x in h.mean(0).tolist()],
            "tau_by_k": [round(1 + x, 3) for x in run.cumsum(-1).mean(0).tolist()],
        }

    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=args.lr,
                            betas=(0.9, 0.95), weight_decay=0.0)
    common.log(stage="eagle3", sequences=len(seqs), length=T, prompt=prompt_len, aux=aux,
               draft_vocab=len(tokens), params=sum(p.numel() for p in head.parameters()))
    step, qat, total = 0, False, None
    import time
    t0 = time.time()
    while True:
        if args.max_steps and step >= args.max_steps:
            break
        left = deadline.left() - 45  # evaluation and export
        if left <= 0:
            break
        if step == 20:
            per = (time.time() - t0) / 20
            total = step + int(left / per)
        frac = step / total if total else 0.0
        if not qat and total and frac >= 1 - args.qat_frac:
            common.enable_qat(head)
            qat = True
            common.log(step=step, qat=True)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.5 * (1 + math.cos(math.pi * min(frac, 1.0))) * 0.9 + 0.1)
        for gparam in opt.param_groups:
            gparam["lr"] = lr
        idx = rng.choice(train_n, size=args.batch, replace=False)
        timed = step == 30 and dev == "cuda"  # where a step's time goes, logged once
        marks = [time.time()]

        def mark():
            if timed:
                torch.cuda.synchronize()
                marks.append(time.time())
        mark()
        batch = batch_of(idx)
        mark()
        loss, agree = losses(*batch)
        mark()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        mark()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        mark()
        if timed:
            ms = [round(1000 * (y - x), 1) for x, y in zip(marks[1:], marks[2:])]
            common.log(step_ms=dict(zip(["target", "head_forward_loss", "backward", "optimizer"], ms)))
        if step % 100 == 0:
            common.log(step=step, loss=round(loss.item(), 4), lr=round(lr, 6),
                       agree=[round(a.float().mean().item(), 3) for a in agree], left=round(deadline.left()))
        step += 1
    if args.max_steps and not qat:
        common.enable_qat(head)
    ev = evaluate()
    ev.update(steps=step, qat=True, aux_layers=aux, ttt=K, batch=args.batch)
    common.log(**ev)
    export(head, cfg, tokens, args.out)
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(ev, f, indent=2)


if __name__ == "__main__":
    main()
