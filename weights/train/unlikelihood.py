"""Sequence-level unlikelihood training (Welleck et al. 2019, "Neural Text
Generation with Unlikelihood Training", section 5.2), as train.py's
`--stage ul` uses it against greedy loops:

  1. the model's own greedy continuations of training-set prompts
     (`greedy_pool`, regenerated as it trains: on-policy);
  2. in each continuation, the tokens that continue a copy: token i is
     flagged when the n tokens ending at it (it and its n - 1 predecessors)
     already occurred earlier in the same continuation, overlapping or not
     (`repeat_mask`; the prompt is not searched: a continuation may quote
     its context, it may not quote itself for n tokens);
  3. the penalty -log(1 - p(token)) at the flagged positions
     (`unlikelihood_loss`), mixed with the ordinary next-token loss on raw
     text, which keeps the held-out loss where it was.

-log(1 - p) is computed as logsumexp(z) - logsumexp(z without the token),
exact in f32 when p is near 1 (the usual case in a loop), and its gradient
with respect to the logits is bounded (at most 2 in norm per token), so a
confident loop cannot swamp the MLE gradient.

The functions need only torch (and numpy, HF's generate for the pool).
"""
import numpy as np
import torch


def repeat_mask(seq, start, n):
    """(B, T) bool: True at position i (i >= start + n - 1) when seq[i-n+1 .. i]
    equals seq[j-n+1 .. j] for some start + n - 1 <= j < i."""
    x = seq[:, start:]
    b, length = x.shape
    mask = torch.zeros(seq.shape, dtype=torch.bool, device=seq.device)
    m = length - n + 1  # n-grams: gram g is x[g : g+n], it ends at g + n - 1
    if m < 2:
        return mask
    eq = torch.ones(b, m, m, dtype=torch.bool, device=seq.device)
    for k in range(n):
        a = x[:, k:k + m]
        eq &= a.unsqueeze(2) == a.unsqueeze(1)  # eq[:, g, h]: grams g and h agree so far
    earlier = torch.ones(m, m, dtype=torch.bool, device=seq.device).tril(diagonal=-1)  # h < g
    mask[:, start + n - 1:] = (eq & earlier).any(-1)
    return mask


def unlikelihood_loss(logits, targets, mask, denom=None):
    """Sum over flagged positions of -log(1 - p(target)), over denom
    (default: every position). logits (B, L, V) score targets (B, L); mask
    (B, L) bool."""
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    other = torch.logsumexp(z.scatter(-1, targets.unsqueeze(-1), float("-inf")), dim=-1)
    per_token = lse - other  # -log(1 - p) >= 0
    denom = denom if denom is not None else targets.numel()
    return (per_token * mask.to(per_token.dtype)).sum() / denom


def greedy_pool(model, ids, rng, n, prompt, new, batch=2048):
    """n greedy continuations of `new` tokens after random `prompt`-token
    windows of ids (a uint32 memmap), under bf16 autocast: (n, prompt + new)
    int64 on the model's device. Leaves the model in the mode it was in."""
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        done = 0
        while done < n:
            b = min(batch, n - done)
            starts = rng.integers(0, len(ids) - prompt, size=b)
            p = torch.from_numpy(np.stack([ids[s:s + prompt] for s in starts]).astype(np.int64)).to(dev)
            seq = model.generate(input_ids=p, attention_mask=torch.ones_like(p), do_sample=False,
                                 max_new_tokens=new, min_new_tokens=new)
            out.append(seq)
            done += b
    model.train(was_training)
    return torch.cat(out)
