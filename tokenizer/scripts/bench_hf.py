#!/usr/bin/env python3
"""Hugging Face tokenizers' encode throughput on the benchmark corpus, single-threaded.

The counterpart of `go test ./tokenizer -bench .` (see BENCHMARKS.md). Run from
the repository root on the machine that runs the Go benchmark:
    python3 tokenizer/scripts/bench_hf.py
RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false are set before tokenizers
is imported, so encode_batch runs on one thread too.
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import gzip  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def best(f, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def row(name, nbytes, seconds, extra=""):
    print(f"{name:<34} {nbytes / seconds / 1e6:9.2f} MB/s {seconds * 1e3:10.1f} ms  {extra}", flush=True)


def main():
    raw = gzip.open(os.path.join(PKG, "qwen3", "tokenizer.json.gz")).read()
    path = os.path.join(tempfile.mkdtemp(), "tokenizer.json")
    with open(path, "wb") as f:
        f.write(raw)
    corpus = gzip.open(os.path.join(PKG, "testdata", "corpus.txt.gz")).read().decode("utf-8")
    n = len(corpus.encode())
    lines = corpus.splitlines(keepends=True)
    print(f"tokenizers {tokenizers.__version__}, Python {sys.version.split()[0]}, "
          f"RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']}; corpus {n} bytes, {len(lines)} lines", flush=True)

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(path)
    print(f"{'load (Tokenizer.from_file)':<34} {(time.perf_counter() - t0) * 1e3:26.1f} ms", flush=True)

    t0 = time.perf_counter()
    ids = tok.encode(corpus, add_special_tokens=False).ids
    row("encode(corpus), cold cache", n, time.perf_counter() - t0, f"{len(ids)} tokens")
    row("encode(corpus), warm, best of 5", n, best(lambda: tok.encode(corpus, add_special_tokens=False), 5))
    row("encode(line) per line, best of 3", n,
        best(lambda: [tok.encode(l, add_special_tokens=False) for l in lines], 3))
    row("encode_batch(lines), 1 thread", n, best(lambda: tok.encode_batch(lines, add_special_tokens=False), 3))
    row("decode(corpus ids), best of 3", n, best(lambda: tok.decode(ids, skip_special_tokens=False), 3))

    for name, unit in [("spaces", " "), ("letter", "a"), ("newlines", "\n"), ("digit", "7"), ("han", "中")]:
        text = unit * ((1 << 20) // len(unit.encode()))
        fresh = Tokenizer.from_file(path)
        t0 = time.perf_counter()
        k = len(fresh.encode(text, add_special_tokens=False).ids)
        row(f"encode(1 MiB of {name})", len(text.encode()), time.perf_counter() - t0, f"{k} tokens")


if __name__ == "__main__":
    main()
