#!/usr/bin/env python3
"""Stage 1: the corpus. Collects Python sources present on the GPU machine —
the standard library (PSF-2.0) and every installed package whose metadata
declares a permissive license (MIT, BSD, Apache-2.0, PSF, ISC, …; packages
with copyleft, proprietary or unknown licenses are left out) — and, with
--go-src, the Go toolchain's own sources (BSD-3-Clause) from the tarball
pack_go_src.sh made on a machine with Go; drops exact duplicates (vendored
copies), splits by file into train and held-out sets (2 % of files, by a
hash of the path: never trained on), tokenizes with the Qwen3 tokenizer,
and writes:

  DATA/train.bin, DATA/heldout.bin   uint32 token ids, files separated by <|endoftext|>
  DATA/token_counts.npy               uint64 count of each token id over train.bin (151,936)
  DATA/heldout_prompts.jsonl          prompts for `webdraft bench spec` (held-out Python files only)
  DATA/files.tsv                      every file: source, split, bytes, tokens
  DATA/DATA_MANIFEST.md               every source with its license, the split, the
                                      held-out files and the command (weights/DATA_MANIFEST.md)

    python3 weights/train/prepare_data.py --out /tmp/data
    python3 weights/train/prepare_data.py --out /tmp/data --go-src .gpu/gosrc.tar.xz
"""
import argparse
import hashlib
import importlib.metadata as md
import io
import json
import os
import re
import sysconfig
import tarfile

import numpy as np

import common

PERMISSIVE = re.compile(r"\b(MIT|BSD|Apache|PSF|Python Software Foundation|ISC|Unlicense|zlib|HPND|CC0|0BSD)\b", re.I)
COPYLEFT = re.compile(r"GPL|MPL|Mozilla|EPL|Eclipse|CDDL|proprietary|commercial|NVIDIA|Other/", re.I)
MAX_FILE_BYTES = 512 << 10  # larger .py files are generated tables, not code
HELDOUT_EVERY = 50          # 2 % of files
GO_LICENSE = "BSD-3-Clause (LICENSE of the Go toolchain)"


def package_license(dist):
    """The license a distribution declares, or None when it is not clearly
    permissive: License-Expression, else License (first line), else the
    trove classifiers; every one that is present must be permissive."""
    m = dist.metadata
    found = []
    if m.get("License-Expression"):
        found.append(m["License-Expression"].strip())
    lic = (m.get("License") or "").strip().splitlines()
    if lic and len(lic[0]) < 80 and lic[0] not in ("UNKNOWN", ""):
        found.append(lic[0].strip())
    found += [c.split("::")[-1].strip() for c in (m.get_all("Classifier") or []) if c.startswith("License ::")
              and "OSI Approved" != c.split("::")[-1].strip()]
    if not found or any(COPYLEFT.search(f) or not PERMISSIVE.search(f) for f in found):
        return None
    return "; ".join(dict.fromkeys(found))


def stdlib_sources():
    root = sysconfig.get_paths()["stdlib"]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                yield "stdlib/" + os.path.relpath(path, root), path


def package_sources(dist):
    for f in sorted(dist.files or [], key=str):
        if f.suffix == ".py" and "__pycache__" not in f.parts:
            path = str(f.locate())
            yield f"{dist.metadata['Name']}/{f}", path


def sources():
    """(source name, version, license, [(file name, path)]) for every source."""
    yield ("python-stdlib", sysconfig.get_python_version(), "PSF-2.0 (Python Software Foundation License)",
           list(stdlib_sources()))
    seen = set()
    for dist in sorted(md.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        name = dist.metadata["Name"]
        if not name or name.lower() in seen:
            continue
        seen.add(name.lower())
        lic = package_license(dist)
        files = list(package_sources(dist))
        if files:
            yield name, dist.version, lic, files


def go_sources(tarball):
    """("go", version, license, [(file name, bytes)]) for the Go toolchain's
    sources in a tarball of pack_go_src.sh: every regular src/**/*.go member
    as go/src/…, the version from VERSION's first line. Fails (before any
    tokenizing) when the tarball lacks LICENSE, VERSION or .go files."""
    files, version, bsd = [], None, False
    with tarfile.open(tarball, "r:xz") as tar:
        for m in tar:
            if not m.isfile():
                continue
            if m.name == "LICENSE":
                text = " ".join(tar.extractfile(m).read().decode("utf-8").split())
                bsd = all(c in text for c in ("Redistribution and use in source and binary forms",
                                              "Neither the name of", "Copyright"))
            elif m.name == "VERSION":
                version = tar.extractfile(m).read().decode("utf-8").splitlines()[0].strip()
            elif m.name.startswith("src/") and m.name.endswith(".go") and m.size <= MAX_FILE_BYTES:
                files.append(("go/" + m.name, tar.extractfile(m).read()))
    if not bsd or not version or not files:
        raise SystemExit(f"{tarball}: want LICENSE (BSD-3-Clause), VERSION and src/**/*.go (made by pack_go_src.sh)")
    return "go", version, GO_LICENSE, files


def read_text(src):
    """The text of a file — a path, or a tarball member's bytes, decoded as
    open(path, encoding="utf-8") would (newlines translated) — or None when
    it is over MAX_FILE_BYTES or not UTF-8."""
    try:
        if isinstance(src, bytes):
            if len(src) > MAX_FILE_BYTES:
                return None
            return io.TextIOWrapper(io.BytesIO(src), encoding="utf-8").read()
        if os.path.getsize(src) > MAX_FILE_BYTES:
            return None
        return open(src, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-files", type=int, default=0,
                    help="at most this many files (smoke tests; as many again from --go-src)")
    ap.add_argument("--max-source-mb", type=float, default=24,
                    help="at most this many MB of code from one Python source, so no package dominates")
    ap.add_argument("--go-src", metavar="TARBALL",
                    help="also the Go toolchain's sources: the .tar.xz of pack_go_src.sh (held-out prompts stay Python)")
    ap.add_argument("--go-max-mb", type=float, default=0,
                    help="with --go-src: at most this many MB of Go code (0: all of it)")
    ap.add_argument("--prompts", type=int, default=256, help="held-out prompts to write")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # The Go tarball is read first, so that a bad one fails before the work.
    go = go_sources(args.go_src) if args.go_src else None
    tok = common.tokenizer()
    eot = tok.token_to_id("<|endoftext|>")

    kept, skipped, digests = [], [], set()  # kept: (source, file, split, text)
    table = []
    # The Python sources as without --go-src, then the Go one: the Python
    # files kept, and so the held-out prompts, do not depend on it.
    corpora = [(sources(), args.max_source_mb)]
    if go:
        corpora.append(([go], args.go_max_mb or float("inf")))
    python_files = 0  # kept[:python_files] are the Python files
    for c, (corpus, max_mb) in enumerate(corpora):
        budget = len(kept) + args.max_files if args.max_files else None
        for name, version, lic, files in corpus:
            if lic is None:
                skipped.append((name, version, len(files)))
                continue
            # A fixed pseudo-random order, so the per-source cap takes a spread of files.
            files.sort(key=lambda f: hashlib.sha1(f[0].encode()).digest())
            size = nfiles = 0
            for fname, src in files:
                if budget is not None and len(kept) >= budget:
                    break
                text = read_text(src)
                if text is None:
                    continue
                digest = hashlib.sha1(text.encode()).digest()
                if not text.strip() or digest in digests:
                    continue
                if size + len(text) > max_mb * 1e6:
                    break
                digests.add(digest)
                size += len(text)
                nfiles += 1
                split = "heldout" if int(hashlib.sha1(fname.encode()).hexdigest(), 16) % HELDOUT_EVERY == 0 else "train"
                kept.append((name, fname, split, text))
            if nfiles:
                table.append({"source": name, "version": version, "license": lic, "files": nfiles, "bytes": size})
        if c == 0:
            python_files = len(kept)

    encoded = tok.encode_batch([t for _, _, _, t in kept], add_special_tokens=False)
    split_ids = {"train": [], "heldout": []}
    python_heldout = []  # the held-out prompts' files
    files_out = []
    tokens = {}
    for i, ((name, fname, split, text), enc) in enumerate(zip(kept, encoded)):
        split_ids[split].append(enc.ids + [eot])
        if split == "heldout" and i < python_files:
            python_heldout.append(split_ids[split][-1])
        files_out.append((fname, split, len(text.encode()), len(enc.ids)))
        tokens[name] = tokens.get(name, 0) + len(enc.ids)
    for row in table:
        row["tokens"] = tokens[row["source"]]
    if not split_ids["heldout"] or not split_ids["train"]:
        raise SystemExit(f"{len(kept)} files gave no held-out or no training file: take more files")
    for split, docs in split_ids.items():
        arr = np.fromiter((t for d in docs for t in d), dtype=np.uint32)
        arr.tofile(os.path.join(args.out, f"{split}.bin"))
        common.log(split=split, files=len(docs), tokens=int(arr.size))
        if split == "train":
            # Another stage ranks the vocabulary by these.
            counts = np.bincount(arr, minlength=common.VOCAB).astype(np.uint64)
            if counts.size != common.VOCAB:
                raise SystemExit(f"token ids up to {counts.size - 1}: the vocabulary has {common.VOCAB}")

    # Held-out prompts: windows of held-out Python files (the benchmarks
    # compare with figures from before the Go corpus), each file at most
    # once per round, so that the prompts spread over many files.
    rng = np.random.default_rng(1)
    prompts = []
    docs = [d for d in python_heldout if len(d) > 4 * args.prompt_tokens]
    order = []
    while docs and len(prompts) < args.prompts:
        if not order:
            order = list(rng.permutation(len(docs)))
        d = docs[order.pop()]
        s = int(rng.integers(0, len(d) - 3 * args.prompt_tokens))
        prompts.append({"ids": [int(t) for t in d[s:s + args.prompt_tokens]]})
    with open(os.path.join(args.out, "heldout_prompts.jsonl"), "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
    with open(os.path.join(args.out, "files.tsv"), "w") as f:
        f.write("file\tsplit\tbytes\ttokens\n")
        for row in files_out:
            f.write("\t".join(map(str, row)) + "\n")
    write_markdown(os.path.join(args.out, "DATA_MANIFEST.md"), table, skipped, files_out, args,
                   (go[0], go[1], python_files) if go else None)
    # Last, and whole or not at all: pipeline.sh takes it to mean the stage is done.
    path = os.path.join(args.out, "token_counts.npy")
    with open(path + ".tmp", "wb") as f:
        np.save(f, counts)
    os.replace(path + ".tmp", path)
    common.log(prompts=len(prompts), files=len(files_out), sources=len(table), skipped_sources=len(skipped))


def write_markdown(path, table, skipped, files, args, go=None):
    """The manifest for people: every source and its license, the split, the
    held-out files, and the commands that made it. go: (source name, version,
    index of its first file in files) of the Go corpus, when there is one."""
    cmd = "python3 weights/train/prepare_data.py --out DATA"
    if args.max_files:
        cmd += f" --max-files {args.max_files}"
    if args.max_source_mb != 24:
        cmd += f" --max-source-mb {args.max_source_mb:g}"
    if go:
        tarball = os.path.abspath(args.go_src)
        if tarball.startswith(common.REPO + os.sep):
            tarball = os.path.relpath(tarball, common.REPO)
        cmd += f" --go-src {tarball}"
        if args.go_max_mb:
            cmd += f" --go-max-mb {args.go_max_mb:g}"
        cmd = (f"# on a machine with the Go toolchain ({go[1]}), in the repository:\n"
               f"bash weights/train/pack_go_src.sh {tarball}\n# then on the GPU machine:\n{cmd}")
    train = [f for f in files if f[1] == "train"]
    held = [f for f in files if f[1] == "heldout"]
    with open(path, "w") as f:
        f.write("# Training data of the shipped pair\n\n")
        if go:
            f.write("Two corpora. (1) ")
        f.write("Python source files present on the GPU machine: the standard library and the installed packages "
                "whose metadata declares a permissive license. Packages with a copyleft, proprietary or unstated "
                "license were left out (listed at the end). Exact duplicate files were kept once; files over "
                f"{MAX_FILE_BYTES >> 10} KiB (generated tables) and more than {args.max_source_mb:g} MB from one "
                "source were left out.")
        if go:
            cap = f"at most {args.go_max_mb:g} MB of it" if args.go_max_mb else "all of it"
            f.write(f" (2) The Go toolchain's own sources ({go[1]}, source `{go[0]}`, BSD-3-Clause: the toolchain's "
                    "LICENSE), packed by `weights/train/pack_go_src.sh` on a machine with Go (the GPU machine has "
                    "none): every .go file under `$(go env GOROOT)/src`, tests included, named `go/src/…` here, "
                    "less any path with a `testdata/` or `vendor/` component (vendored code has other licenses), "
                    f"files over {MAX_FILE_BYTES >> 10} KiB and files whose first 4 KiB say `Code generated` and "
                    f"`DO NOT EDIT` (generated tables); exact duplicates of a file kept before were dropped; {cap} "
                    "was taken. The held-out prompts (`heldout_prompts.jsonl`) are windows of held-out Python "
                    "files only, as before the Go corpus.")
        f.write(" Nothing else was trained on.\n\n")
        f.write(f"Made by (see weights/train/README.md for every stage):\n\n```sh\n{cmd}\n```\n\n")
        f.write(f"Split by file — {100 / HELDOUT_EVERY:g} % held out by a hash of the file's name, never trained "
                f"on: {len(train):,} training files ({sum(x[3] for x in train):,} tokens), {len(held):,} held-out "
                f"files ({sum(x[3] for x in held):,} tokens)")
        if go:
            gtrain = [x for x in files[go[2]:] if x[1] == "train"]
            gheld = [x for x in files[go[2]:] if x[1] == "heldout"]
            f.write(f"; of them Go: {len(gtrain):,} training files ({sum(x[3] for x in gtrain):,} tokens), "
                    f"{len(gheld):,} held-out files ({sum(x[3] for x in gheld):,} tokens)")
        f.write(". `files.tsv.gz` beside this file lists every file with its split.\n\n")
        f.write("## Sources\n\n| source | version | license (as its metadata declares) | files | bytes | tokens |\n"
                "| --- | --- | --- | ---: | ---: | ---: |\n")
        for r in table:
            f.write(f"| {r['source']} | {r['version']} | {r['license']} | {r['files']:,} | {r['bytes']:,} | "
                    f"{r['tokens']:,} |\n")
        f.write("\n## Held-out files\n\n")
        for x in held:
            f.write(f"- {x[0]}\n")
        f.write("\n## Left out for their license\n\n")
        for name, version, n in skipped:
            f.write(f"- {name} {version} ({n} .py files)\n")


if __name__ == "__main__":
    main()
