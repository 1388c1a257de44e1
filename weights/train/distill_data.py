#!/usr/bin/env python3
"""Stage 3: the distillation set — the shipped (int4) target's greedy
continuations of training-set prompts, computed on the GPU with the
weights exactly as webdraft runs them (dequantized from the converted
folder). The drafter then learns to agree with its target.

  DATA/distill-SHARD.npy   (N, P+L) uint32: P prompt tokens then L greedy tokens
  DATA/distill.json        {"prompt": P, "new": L}

Shards with different --shard numbers (different prompts) can be made at
once, one per GPU; train.py reads them all.

    python3 weights/train/distill_data.py --target /tmp/target-int4 --data /tmp/data --n 65536
"""
import argparse
import json
import os

import numpy as np
import torch

import common


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="webdraft int4 folder of the target")
    ap.add_argument("--data", required=True)
    ap.add_argument("--n", type=int, default=65536, help="sequences")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--shard", type=int, default=0, help="shard number: names the file and seeds the prompts")
    ap.add_argument("--minutes", type=float, default=6)
    args = ap.parse_args()
    dev = "cuda"
    deadline = common.Deadline(args.minutes)
    model = common.load_webdraft_int4(args.target, dev).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    ids = common.tokens(args.data, "train")
    rng = np.random.default_rng(4 + 1000 * args.shard)
    out = []
    done = 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        while done < args.n and deadline.left() > 20:
            b = min(args.batch, args.n - done)
            starts = rng.integers(0, len(ids) - args.prompt, size=b)
            prompts = torch.from_numpy(np.stack([ids[s:s + args.prompt] for s in starts]).astype(np.int64)).to(dev)
            seq = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                 max_new_tokens=args.new, min_new_tokens=args.new)
            out.append(seq.cpu().numpy().astype(np.uint32))
            done += b
            common.log(sequences=done, seconds_left=round(deadline.left()))
    arr = np.concatenate(out)
    np.save(os.path.join(args.data, f"distill-{args.shard}.npy"), arr)
    with open(os.path.join(args.data, "distill.json"), "w") as f:
        json.dump({"prompt": args.prompt, "new": args.new}, f)
    common.log(shard=args.shard, distill=list(arr.shape))


if __name__ == "__main__":
    main()
