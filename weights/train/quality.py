#!/usr/bin/env python3
"""Stage 7: how good a target's text is, measured rather than eyeballed.
For each webdraft int4 folder (the weights webdraft runs, dequantized):

  - held-out loss, nats per token, over fixed 512-token windows of the
    held-out Python files (never trained on; the Go files are left out so
    that targets trained with and without them compare);
  - the greedy continuations (f32) of the held-out prompts: the fraction
    that fall into a loop — a run of 12 tokens occurring 3 times without
    overlap — and distinct-4 (unique 4-grams / 4-grams, per continuation,
    averaged), the same definitions as `webdraft bench spec`;
  - a few continuations as text, to quote: of the first --quote prompts,
    and of a few fixed ones (TEXTS, and --text), each alone.

The same figures for random windows of held-out Python code are the
reference: real code does not loop.

    python3 weights/train/quality.py --data DATA --model old=weights/target --model new=OUT/target --out q.json
"""
import argparse
import gzip
import json
import os

import numpy as np
import torch

import common


# Fixed prompts whose greedy continuations are quoted for every model.
TEXTS = [
    "def fibonacci(n):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "import os\n\n\ndef read_lines(path):\n    ",
    "func main() {\n\t",
]


def loops(ids, run=12, times=3):
    """Whether some run of `run` tokens occurs `times` times without overlap
    (occurrences counted left to right)."""
    seen = {}
    for i in range(len(ids) - run + 1):
        g = tuple(ids[i:i + run])
        count, free = seen.get(g, (0, 0))
        if i >= free:
            count, free = count + 1, i + run
            if count >= times:
                return True
            seen[g] = (count, free)
    return False


def distinct(ids, n=4):
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def text_figures(conts):
    return {"loop_rate": round(sum(loops(c) for c in conts) / len(conts), 4),
            "distinct_4": round(sum(distinct(c) for c in conts) / len(conts), 4),
            "continuations": len(conts)}


def heldout_python(data):
    """The held-out Python files' tokens: heldout.bin's first files
    (prepare_data.py writes the Python files before the Go ones), as many as
    files.tsv lists, each followed by <|endoftext|>."""
    opener = gzip.open if os.path.exists(os.path.join(data, "files.tsv.gz")) else open
    name = "files.tsv.gz" if opener is gzip.open else "files.tsv"
    n = 0
    with opener(os.path.join(data, name), "rt") as f:
        next(f)
        for line in f:
            file, split, _, tokens = line.rstrip("\n").split("\t")
            if split == "heldout" and not file.startswith("go/"):
                n += int(tokens) + 1
    ids = common.tokens(data, "heldout")[:n]
    eot = common.tokenizer().token_to_id("<|endoftext|>")
    assert len(ids) == n and ids[-1] == eot, "heldout.bin does not start with the Python files"
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="prepare_data.py's folder")
    ap.add_argument("--model", action="append", required=True, metavar="NAME=DIR", help="a webdraft int4 folder")
    ap.add_argument("--new", type=int, default=128, help="tokens a continuation")
    ap.add_argument("--windows", type=int, default=64, help="512-token windows for the loss")
    ap.add_argument("--quote", type=int, default=4, help="continuations to keep as text")
    ap.add_argument("--text", action="append", default=[], help="another prompt to quote (besides TEXTS)")
    ap.add_argument("--out", required=True, help="JSON file")
    args = ap.parse_args()
    dev = "cuda"
    tok = common.tokenizer()
    held = heldout_python(args.data)
    rng = np.random.default_rng(3)
    starts = rng.integers(0, len(held) - 513, size=args.windows)
    windows = torch.from_numpy(np.stack([held[s:s + 513] for s in starts]).astype(np.int64)).to(dev)
    with open(os.path.join(args.data, "heldout_prompts.jsonl")) as f:
        prompts = [json.loads(line)["ids"] for line in f]
    assert len({len(p) for p in prompts}) == 1, "prompts of one length (no padding)"
    # Real code as the reference: random windows of held-out Python.
    ref = [held[s:s + args.new].tolist() for s in rng.integers(0, len(held) - args.new, size=48)]
    result = {"reference_code_windows": text_figures(ref), "models": {}}
    common.log(reference=result["reference_code_windows"])
    for spec in args.model:
        name, folder = spec.split("=", 1)
        model = common.load_webdraft_int4(folder, dev).eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        with torch.no_grad():
            losses = [model(input_ids=windows[i:i + 8], labels=windows[i:i + 8]).loss.item()
                      for i in range(0, len(windows), 8)]
            conts = []
            for i in range(0, len(prompts), 128):
                p = torch.tensor(prompts[i:i + 128], device=dev)
                seq = model.generate(input_ids=p, attention_mask=torch.ones_like(p), do_sample=False,
                                     max_new_tokens=args.new, min_new_tokens=args.new)
                conts += seq[:, p.shape[1]:].cpu().tolist()
            texts = []
            for text in TEXTS + args.text:
                p = torch.tensor([tok.encode(text).ids], device=dev)
                seq = model.generate(input_ids=p, attention_mask=torch.ones_like(p), do_sample=False,
                                     max_new_tokens=args.new, min_new_tokens=args.new)
                texts.append({"prompt": text, "continuation": tok.decode(seq[0, p.shape[1]:].cpu().tolist())})
        fig = {"heldout_loss": round(float(np.mean(losses)), 4), **text_figures(conts),
               "quotes": [{"prompt": tok.decode(prompts[i]), "continuation": tok.decode(conts[i])}
                          for i in range(min(args.quote, len(conts)))] + texts}
        result["models"][name] = fig
        common.log(model=name, **{k: v for k, v in fig.items() if k != "quotes"})
        del model
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
