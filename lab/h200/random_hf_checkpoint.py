#!/usr/bin/env python3
"""Write a random Qwen3 checkpoint of a published shape with Hugging Face
transformers, as `save_pretrained` writes it (bf16 safetensors, sharded).

Real Qwen3 weights cannot be downloaded where webdraft is developed; this
builds checkpoints of the real shapes for speed measurements and for checking
webdraft's loader and engine against them. Needs torch and transformers
(run it on the GPU machine).

    python3 lab/h200/random_hf_checkpoint.py --shape qwen3-1.7b --out /tmp/qwen3-1.7b
"""
import argparse

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

SHAPES = {
    # Published Qwen3 shapes (docs/reference.md, "Model folders").
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     tie_word_embeddings=False),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init-std", type=float, default=0.02, help="initializer_range")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    cfg = Qwen3Config(vocab_size=151936, max_position_embeddings=40960, rope_theta=1e6,
                      rms_norm_eps=1e-6, initializer_range=args.init_std, **SHAPES[args.shape])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size="2GB")
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.shape} ({n / 1e9:.2f} B parameters) to {args.out}")


if __name__ == "__main__":
    main()
