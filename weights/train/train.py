#!/usr/bin/env python3
"""Stages 2, 4 and 5: train a model of the pair for a wall-clock budget.

  --role target  --stage raw      the target on the corpus, from scratch
  --role drafter --stage raw      the drafter on the corpus, from scratch
  --role drafter --stage distill  the drafter on the target's greedy
                                  continuations (distill_data.py), from --init:
                                  cross-entropy on the continuation tokens, plus
                                  --kl times the KL divergence from the target's
                                  next-token distribution (--target, online)
  --role drafter --stage qat      the same loss with int4 quantization-aware
                                  training for the int4 scheme (docs/reference.md), from --init

Each run saves a Hugging Face checkpoint (f32, save_pretrained) to --out and
starts from --init (a second run of the target continues the first with a
new warm-up and cosine cycle: --init, --seed, --lr); `webdraft convert
--quant int4` makes the shipped folder. The drafter trains on the target's
embedding as webdraft runs it, frozen (--embedding-from, the target's int4
folder), and --export
writes it without that embedding for `webdraft convert --embedding-from`.

    python3 weights/train/train.py --role target --stage raw --data /tmp/data --out /tmp/target --minutes 8
"""
import argparse
import glob
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

import common


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=sorted(common.SHAPES), required=True)
    ap.add_argument("--stage", choices=["raw", "distill", "qat"], required=True)
    ap.add_argument("--data", required=True, help="prepare_data.py's folder (and distill_data.py's distill-*.npy for distill/qat)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--init", help="checkpoint to start from: a Hugging Face folder, or a webdraft int4 folder (dequantized)")
    ap.add_argument("--minutes", type=float, default=8)
    ap.add_argument("--max-steps", type=int, default=0, help="for smoke tests")
    ap.add_argument("--batch", type=int, default=0, help="sequences a step (default 64 raw, 128 distill)")
    ap.add_argument("--seq", type=int, default=512, help="raw-text window")
    ap.add_argument("--lr", type=float, default=0)
    ap.add_argument("--kl", type=float, default=0, help="weight of the KL term (distill, qat)")
    ap.add_argument("--target", help="the target's webdraft int4 folder, for --kl")
    ap.add_argument("--seed", type=int, default=1, help="seeds the raw-text windows")
    ap.add_argument("--warmup", type=int, default=50, help="steps of linear warm-up")
    ap.add_argument("--embedding-from", help="the target's webdraft int4 folder: its embedding, frozen, is the model's")
    ap.add_argument("--export", help="with --embedding-from: also write the model without the embedding, and the corpus's ranked tokens, here")
    args = ap.parse_args()
    if args.export and not args.embedding_from:
        raise SystemExit("--export needs --embedding-from")
    torch.manual_seed(0)
    dev = "cuda"
    deadline = common.Deadline(args.minutes)

    if args.init and common.is_webdraft(args.init):
        # The shipped int4 weights, dequantized: a later session goes on
        # training the target from the tree's own folder.
        model = common.load_webdraft_int4(args.init, dev)
    elif args.init:
        from transformers import Qwen3ForCausalLM
        model = Qwen3ForCausalLM.from_pretrained(args.init, dtype=torch.float32).to(dev)
    else:
        model = common.new_model(args.role, dev)
    if args.embedding_from:
        common.share_embedding(model, args.embedding_from)
    if args.stage == "qat":
        common.enable_qat(model)
    lr = args.lr or {"raw": 2e-3 if args.role == "target" else 3e-3, "distill": 1e-3, "qat": 2e-4}[args.stage]
    teacher = None
    if args.kl:
        if args.stage == "raw" or not args.target:
            raise SystemExit("--kl needs --stage distill or qat and --target")
        teacher = common.load_webdraft_int4(args.target, dev).eval().requires_grad_(False)

    if args.stage == "raw":
        batch = args.batch or 64
        source = common.batches(common.tokens(args.data, "train"), batch, args.seq, seed=args.seed)
        heldout = common.batches(common.tokens(args.data, "heldout"), 32, args.seq, seed=3)
        eval_set = [next(heldout) for _ in range(4)]
        prompt_len = 0
    else:
        batch = args.batch or 128
        seqs, prompt_len = load_distill(args.data)
        # The last 1024 sequences are never trained on: the agreement check.
        eval_set = [torch.from_numpy(seqs[i:i + 64].astype(np.int64)) for i in range(len(seqs) - 1024, len(seqs), 64)]
        train_n = len(seqs) - 1024
        rng = np.random.default_rng(2)

        def distill_batches():
            while True:
                idx = rng.choice(train_n, size=batch, replace=False)
                yield torch.from_numpy(seqs[idx].astype(np.int64))
        source = distill_batches()

    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    warmup = args.warmup

    def loss_of(w):
        """Raw text: next-token cross-entropy. Distillation: cross-entropy on
        the target's continuation (not the prompt), plus --kl times
        KL(target ‖ drafter) there; also the argmax agreement."""
        if args.stage == "raw":
            return model(input_ids=w, labels=w).loss, None  # the model shifts the labels
        logits = model(input_ids=w).logits[:, prompt_len - 1:-1].float()
        labels = w[:, prompt_len:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        agree = (logits.argmax(-1) == labels).float().mean()
        if teacher is not None:
            with torch.no_grad():
                t = teacher(input_ids=w).logits[:, prompt_len - 1:-1].float().log_softmax(-1)
            kl = F.kl_div(logits.log_softmax(-1), t, log_target=True, reduction="none").sum(-1).mean()
            loss = loss + args.kl * kl
        return loss, agree

    def evaluate():
        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            res = [loss_of(w.to(dev)) for w in eval_set]
        model.train()
        out = {"heldout_loss": round(sum(r[0].item() for r in res) / len(res), 4)}
        if res[0][1] is not None:
            out["heldout_agreement"] = round(sum(r[1].item() for r in res) / len(res), 4)
        return out

    common.log(role=args.role, stage=args.stage, params=sum(p.numel() for p in model.parameters()),
               trainable=sum(p.numel() for p in trainable), lr=lr, batch=batch, kl=args.kl, **evaluate())
    step, est_total = 0, None
    model.train()
    t_start = deadline.left()
    while True:
        if args.max_steps and step >= args.max_steps:
            break
        left = deadline.left()
        if left < 30:  # keep time to save
            break
        w = next(source).to(dev)
        # Cosine decay over the expected number of steps in the budget.
        if step == 20:
            per_step = (t_start - left) / 20
            est_total = max(100, int(t_start / per_step))
        frac = min(1.0, step / est_total) if est_total else 0.0
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = loss_of(w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        step += 1
        if step % 100 == 0:
            common.log(step=step, loss=round(loss.item(), 4), seconds_left=round(deadline.left()))
    common.log(role=args.role, stage=args.stage, steps=step, **evaluate())
    if args.embedding_from:
        common.share_embedding_check(model, args.embedding_from)
    model.save_pretrained(args.out, safe_serialization=True)
    if args.export:
        common.export_shared(model, args.export, args.embedding_from, args.data)


def load_distill(data):
    """distill_data.py's shards, concatenated: (N, P+L) uint32, and P."""
    paths = sorted(glob.glob(os.path.join(data, "distill-*.npy")))
    if not paths:
        raise SystemExit(f"no distill-*.npy in {data}: run distill_data.py first")
    with open(os.path.join(data, "distill.json")) as f:
        prompt_len = json.load(f)["prompt"]
    return np.concatenate([np.load(p) for p in paths]), prompt_len


if __name__ == "__main__":
    main()
