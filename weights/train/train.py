#!/usr/bin/env python3
"""Stages 2, 4 and 5: train a model of the pair for a wall-clock budget.

  --role target  --stage raw      the target on the corpus, from scratch
  --role drafter --stage raw      the drafter on the corpus, from scratch
  --role drafter --stage distill  the drafter on the target's greedy
                                  continuations (distill_data.py), from --init
  --role drafter --stage qat      int4 quantization-aware fine-tuning for
                                  CONTRACTS.md §2, from --init

Each run saves a Hugging Face checkpoint (f32, save_pretrained) to --out and
resumes from --init; `webdraft convert --quant int4` makes the shipped folder.

    python3 weights/train/train.py --role target --stage raw --data /tmp/data --out /tmp/target --minutes 8
"""
import argparse
import math
import os

import numpy as np
import torch

import common


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=sorted(common.SHAPES), required=True)
    ap.add_argument("--stage", choices=["raw", "distill", "qat"], required=True)
    ap.add_argument("--data", required=True, help="prepare_data.py's folder (and distill.npy for distill/qat)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--init", help="checkpoint to start from")
    ap.add_argument("--minutes", type=float, default=8)
    ap.add_argument("--max-steps", type=int, default=0, help="for smoke tests")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    deadline = common.Deadline(args.minutes)

    if args.init:
        from transformers import Qwen3ForCausalLM
        model = Qwen3ForCausalLM.from_pretrained(args.init, dtype=torch.float32).to(dev)
    else:
        model = common.new_model(args.role, dev)
    if args.stage == "qat":
        common.enable_qat(model)
    lr = args.lr or {"raw": 3e-3, "distill": 1e-3, "qat": 2e-4}[args.stage]

    if args.stage == "raw":
        source = common.batches(common.tokens(args.data, "train"), args.batch, args.seq, seed=1)
    else:
        seqs = np.load(os.path.join(args.data, "distill.npy"), mmap_mode="r")
        rng = np.random.default_rng(2)

        def distill_batches():
            while True:
                idx = np.sort(rng.choice(len(seqs), size=args.batch, replace=False))
                yield torch.from_numpy(np.asarray(seqs[idx]).astype(np.int64))
        source = distill_batches()
    heldout = common.batches(common.tokens(args.data, "heldout"), 32, args.seq, seed=3)
    eval_set = [next(heldout) for _ in range(4)]

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 50

    def evaluate():
        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            losses = [model(input_ids=w.to(dev), labels=w.to(dev)).loss.item() for w in eval_set]
        model.train()
        return sum(losses) / len(losses)

    common.log(role=args.role, stage=args.stage, params=sum(p.numel() for p in model.parameters()), lr=lr,
               heldout_loss=evaluate())
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
            loss = model(input_ids=w, labels=w).loss  # the model shifts the labels
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0:
            common.log(step=step, loss=round(loss.item(), 4), seconds_left=round(deadline.left()))
    common.log(role=args.role, stage=args.stage, steps=step, heldout_loss=evaluate())
    model.save_pretrained(args.out, safe_serialization=True)


if __name__ == "__main__":
    main()
