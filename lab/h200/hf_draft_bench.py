#!/usr/bin/env python3
"""The baseline of webdraft's engine benchmark: Hugging Face transformers
drafting 16 greedy tokens after a 1,024-token context, on the same random
checkpoint webdraft measures, at batch 1 and 32 — bf16 eager, and with the
static KV cache + torch.compile where that runs.

Prints one JSON line per measurement: mode, batch, ms per decode step (the
16 new tokens' time after the prefill, divided by 16) and draft tokens/s.
Run it on the GPU machine beside `webdraft bench engine --model DIR` (same
checkpoint, same context) and compare the two in BENCHMARKS.md.

    python3 lab/h200/hf_draft_bench.py --model /tmp/qwen3-1.7b --context 1024 --batches 1,32
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def measure(model, batch, context, new, repeats, **generate_kwargs):
    """Seconds for the prefill alone and for prefill + new tokens (best of
    repeats, after a warm-up), so the difference is the new tokens' time."""
    g = torch.Generator(device="cpu").manual_seed(batch)
    ids = torch.randint(0, model.config.vocab_size, (batch, context), generator=g).to(model.device)
    mask = torch.ones_like(ids)

    def run(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                       **generate_kwargs)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    run(new)  # warm-up (compiles, when compiling)
    prefill = min(run(1) for _ in range(repeats))
    full = min(run(new + 1) for _ in range(repeats))
    return prefill, full


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="an HF checkpoint folder (lab/h200/random_hf_checkpoint.py)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--new", type=int, default=16, help="draft tokens")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="eager,compiled")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, attn_implementation="eager")
    model = model.to("cuda").eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    for mode in args.modes.split(","):
        # "compiled": a static KV cache, with which generate compiles the
        # decoding forward pass itself (torch.compile, CUDA graphs).
        kwargs = {"cache_implementation": "static"} if mode == "compiled" else {}
        for b in batches:
            try:
                with torch.no_grad():
                    prefill, full = measure(model, b, args.context, args.new, args.repeats, **kwargs)
            except Exception as e:  # report what does not run, keep measuring the rest
                print(json.dumps({"mode": mode, "batch": b, "error": f"{type(e).__name__}: {e}"[:300]}), flush=True)
                continue
            step = (full - prefill) / args.new
            print(json.dumps({"mode": mode, "batch": b, "context": args.context, "new": args.new,
                              "prefill_ms": round(prefill * 1e3, 2), "ms_per_step": round(step * 1e3, 3),
                              "draft_tok_s": round(b / step, 1)}), flush=True)


if __name__ == "__main__":
    main()
