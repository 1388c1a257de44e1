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
  --role target  --stage ul       from --init: the raw-text loss plus --ul-weight
                                  times sequence-level unlikelihood on the model's
                                  own greedy continuations (unlikelihood.py): a
                                  token that continues a copy of an earlier
                                  --ul-n-gram of its continuation is penalized
                                  by -log(1 - p); the continuations are made
                                  again from the model as it trains (on-policy)

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
import unlikelihood


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=sorted(common.SHAPES), required=True)
    ap.add_argument("--stage", choices=["raw", "distill", "qat", "ul"], required=True)
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
    ap.add_argument("--ul-weight", type=float, default=1.0, help="ul: weight of the unlikelihood term")
    ap.add_argument("--ul-n", type=int, default=10, help="ul: a token is penalized when the n tokens ending at it repeat earlier ones of its continuation")
    ap.add_argument("--ul-batch", type=int, default=32, help="ul: greedy continuations a step")
    ap.add_argument("--ul-pool", type=int, default=2048, help="ul: continuations made at a time (then used once each)")
    ap.add_argument("--ul-prompt", type=int, default=64, help="ul: prompt tokens (training-set windows)")
    ap.add_argument("--ul-new", type=int, default=128, help="ul: greedy tokens after each prompt")
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
    if args.stage == "ul" and not args.init:
        raise SystemExit("--stage ul fine-tunes a trained model: give --init")
    lr = args.lr or {"raw": 2e-3 if args.role == "target" else 3e-3, "distill": 1e-3, "qat": 2e-4, "ul": 1e-3}[args.stage]
    teacher = None
    if args.kl:
        if args.stage == "raw" or not args.target:
            raise SystemExit("--kl needs --stage distill or qat and --target")
        teacher = common.load_webdraft_int4(args.target, dev).eval().requires_grad_(False)

    if args.stage in ("raw", "ul"):
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
        if args.stage in ("raw", "ul"):
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

    ul = None
    if args.stage == "ul":
        ul = UL(model, common.tokens(args.data, "train"), args)
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
        if ul is not None:  # its generation pauses make step times uneven: a cosine over the clock
            frac = min(1.0, (t_start - left) / max(1.0, t_start - 30))
            u, u_mask = ul.next()
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = loss_of(w)
            if ul is not None:
                mle = loss
                ul_loss = ul.loss(u, u_mask)
                loss = mle + args.ul_weight * ul_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        step += 1
        if step % 100 == 0:
            extra = {} if ul is None else {"mle": round(mle.item(), 4), "ul": round(ul_loss.item(), 4)}
            common.log(step=step, loss=round(loss.item(), 4), **extra, seconds_left=round(deadline.left()))
    common.log(role=args.role, stage=args.stage, steps=step, **evaluate(), **({} if ul is None else ul.summary()))
    if args.embedding_from:
        common.share_embedding_check(model, args.embedding_from)
    model.save_pretrained(args.out, safe_serialization=True)
    if args.export:
        common.export_shared(model, args.export, args.embedding_from, args.data)


class UL:
    """The unlikelihood half of --stage ul: pools of the model's greedy
    continuations of training-set prompts, each with the mask of its
    copy-continuing tokens, made again once a pool is used up; each pool's
    loop rate (quality.py's definition) and flagged share are logged."""

    def __init__(self, model, ids, args):
        import quality
        self.loops = quality.loops
        self.model, self.ids, self.args = model, ids, args
        model.generation_config.eos_token_id = None  # as quality.py: the full length, end of text allowed
        model.generation_config.pad_token_id = 0
        self.rng = np.random.default_rng(100 + args.seed)
        self.pool = None
        self.pos = 0
        self.pools = []

    def refill(self):
        a = self.args
        seq = unlikelihood.greedy_pool(self.model, self.ids, self.rng, a.ul_pool, a.ul_prompt, a.ul_new)
        mask = unlikelihood.repeat_mask(seq, a.ul_prompt, a.ul_n)
        conts = seq[:, a.ul_prompt:].cpu().tolist()
        fig = {"pool": len(self.pools), "loop_rate": round(sum(self.loops(c) for c in conts) / len(conts), 4),
               "flagged": round(mask[:, a.ul_prompt:].float().mean().item(), 4)}
        self.pools.append(fig)
        common.log(**fig)
        perm = torch.randperm(len(seq), device=seq.device)
        self.pool, self.mask, self.pos = seq[perm], mask[perm], 0

    def next(self):
        if self.pool is None or self.pos + self.args.ul_batch > len(self.pool):
            self.refill()
        i, self.pos = self.pos, self.pos + self.args.ul_batch
        return self.pool[i:self.pos], self.mask[i:self.pos]

    def loss(self, seq, mask):
        """-log(1 - p) at the flagged tokens, over every continuation token."""
        new = self.args.ul_new
        logits = self.model(input_ids=seq, use_cache=False, logits_to_keep=new + 1).logits[:, :-1]
        return unlikelihood.unlikelihood_loss(logits, seq[:, -new:], mask[:, -new:])

    def summary(self):
        return {"pools": len(self.pools), "first_pool_loop_rate": self.pools[0]["loop_rate"],
                "last_pool_loop_rate": self.pools[-1]["loop_rate"]} if self.pools else {}


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
