#!/usr/bin/env python3
"""Checks train_eagle3.py's head against the EAGLE-3 forward that webdraft's
Go head is tested against (testdata/eagle3/make_head.py, itself checked
against SGLang's and vLLM's llama_eagle3.py): the tiny head's first pass of
five rows and its two draft steps, run as training-time test steps 0, 1
and 2 of the last row, must give the same logits. Needs torch and numpy
only (transformers is not imported):

    python3 weights/train/check_eagle3.py
"""
import os
import sys
import types

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.join(here, "..", "..")
sys.modules.setdefault("transformers", types.SimpleNamespace(Qwen3Config=None, Qwen3ForCausalLM=None))
sys.path[:0] = [here, os.path.join(repo, "testdata", "eagle3")]
import make_head  # noqa: E402
import train_eagle3  # noqa: E402


def read(path):
    """A safetensors file as name -> torch tensor (F32, BF16, I64, BOOL)."""
    import json
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if t["dtype"] == "BF16":
            a = torch.from_numpy((np.frombuffer(b, np.uint16).astype(np.uint32) << 16).view(np.float32).copy())
        else:
            a = torch.from_numpy(np.frombuffer(b, {"F32": np.float32, "I64": np.int64, "BOOL": np.bool_}[t["dtype"]]).copy())
        out[name] = a.reshape(t["shape"])
    return out


def main():
    tiny = os.path.join(repo, "testdata", "eagle3", "tiny")
    w = read(os.path.join(tiny, "model.safetensors"))
    exp = read(os.path.join(tiny, "expected.safetensors"))
    cfg = dict(make_head.CFG)
    head = train_eagle3.Head(cfg)
    state = {k: v for k, v in w.items() if k not in ("embed_tokens.weight", "d2t", "t2d")}
    head.load_state_dict(state)
    ids = torch.cat([exp["ids0"], exp["ids1"], exp["ids2"]])  # tokens 1 … 7 of the text
    emb = w["embed_tokens.weight"][ids][None]
    n = 5
    with torch.no_grad():
        outs = head.ttt(emb, exp["features0"][None], 3)
    worst = 0.0
    for j, want in enumerate([exp["logits0"], exp["logits1"], exp["logits2"]]):
        got = outs[j][0] if j == 0 else outs[j][0, n - 1:n]
        err = ((got - want).abs().max() / want.abs().max()).item()
        worst = max(worst, err)
        print(f"step {j}: max error {err:.2g} of the largest logit")
    if worst > 1e-5:
        sys.exit("train_eagle3.Head differs from the reference forward")
    print("ok")


if __name__ == "__main__":
    main()
