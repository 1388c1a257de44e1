#!/usr/bin/env python3
"""Stage 1: the corpus. Collects the Python standard library's sources on
the GPU machine (PSF License 2.0), splits them by file into train and
held-out sets (2 % of files, by a hash of the path: never trained on),
tokenizes them with the Qwen3 tokenizer, and writes:

  DATA/train.bin, DATA/heldout.bin   uint32 token ids, files separated by <|endoftext|>
  DATA/heldout_prompts.jsonl          prompts for `webdraft bench spec` (held-out files)
  DATA/manifest.json                  every file, its split, size and license
  DATA/DATA_MANIFEST.md               the same for people (weights/DATA_MANIFEST.md)

    python3 weights/train/prepare_data.py --out /tmp/data
"""
import argparse
import hashlib
import json
import os
import sysconfig

import numpy as np

import common


def sources(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-files", type=int, default=0, help="for smoke tests")
    ap.add_argument("--prompts", type=int, default=256, help="held-out prompts to write")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    root = sysconfig.get_paths()["stdlib"]
    tok = common.tokenizer()
    eot = tok.token_to_id("<|endoftext|>")
    files = list(sources(root))
    if args.max_files:
        files = files[:args.max_files]
    split_ids = {"train": [], "heldout": []}
    manifest = []
    for path in files:
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        rel = os.path.relpath(path, root)
        split = "heldout" if int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 50 == 0 else "train"
        ids = tok.encode(text, add_special_tokens=False).ids
        split_ids[split].append(ids + [eot])
        manifest.append({"file": "stdlib/" + rel, "split": split, "bytes": len(text.encode()),
                         "tokens": len(ids), "license": "PSF-2.0 (Python standard library)"})
    if not split_ids["heldout"] or not split_ids["train"]:
        raise SystemExit(f"{len(files)} files gave no held-out or no training file: take more files")
    for split, docs in split_ids.items():
        arr = np.fromiter((t for d in docs for t in d), dtype=np.uint32)
        arr.tofile(os.path.join(args.out, f"{split}.bin"))
        common.log(split=split, files=len(docs), tokens=int(arr.size))

    # Held-out prompts: windows that start at a line start of held-out files.
    rng = np.random.default_rng(1)
    prompts = []
    docs = [d for d in split_ids["heldout"] if len(d) > 4 * args.prompt_tokens]
    while docs and len(prompts) < args.prompts:
        d = docs[rng.integers(len(docs))]
        s = int(rng.integers(0, len(d) - 2 * args.prompt_tokens))
        prompts.append({"ids": [int(t) for t in d[s:s + args.prompt_tokens]]})
    with open(os.path.join(args.out, "heldout_prompts.jsonl"), "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump({"root": root, "python": sysconfig.get_python_version(), "files": manifest}, f, indent=1)
    write_markdown(os.path.join(args.out, "DATA_MANIFEST.md"), root, sysconfig.get_python_version(), manifest, args)
    common.log(prompts=len(prompts), files=len(manifest))


def write_markdown(path, root, version, manifest, args):
    """The manifest as weights/DATA_MANIFEST.md: sources, licenses, commands."""
    train = [m for m in manifest if m["split"] == "train"]
    held = [m for m in manifest if m["split"] == "heldout"]
    with open(path, "w") as f:
        f.write("# Training data of the shipped pair\n\n")
        f.write(f"Every file below comes from the Python {version} standard library as installed "
                f"on the GPU machine (`{root}`), under the PSF License 2.0. Nothing else was trained on.\n\n")
        f.write("Made by:\n\n```sh\npython3 weights/train/prepare_data.py --out DATA"
                + (f" --max-files {args.max_files}" if args.max_files else "") + "\n```\n\n")
        f.write(f"Split by file (2 % held out by a hash of the path, never trained on): "
                f"{len(train)} training files ({sum(m['tokens'] for m in train):,} tokens), "
                f"{len(held)} held-out files ({sum(m['tokens'] for m in held):,} tokens).\n\n")
        f.write("| file | split | bytes | tokens | license |\n| --- | --- | --- | --- | --- |\n")
        for m in manifest:
            f.write(f"| {m['file']} | {m['split']} | {m['bytes']} | {m['tokens']} | {m['license']} |\n")


if __name__ == "__main__":
    main()
