"""Verification as pure functions (no engine state): given the target's logits over [pending, d1..dk], how
many draft tokens each sequence keeps and which token follows them.

Greedy (temperature 0): accept while the draft token is the target's argmax. Sampled: lossless rejection
sampling (accept d with probability min(1, p(d)/q(d)), else resample from norm(max(0, p - q))), so the output
follows the target's distribution exactly. Synthetic: acceptance drawn i.i.d. with probability alpha, or
forced per sequence from a replayed trace (cost studies; the text is no longer the target's).
"""
from __future__ import annotations

import torch


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) in float64 (temperature > 0)."""
    return torch.softmax(logits.double() / temperature, dim=-1)


def sample(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> torch.Tensor:
    """One token per row of logits (..., vocab): argmax at temperature 0, else a draw from probs()."""
    if temperature == 0:
        return logits.argmax(-1)
    p = probs(logits, temperature)
    return torch.multinomial(p.reshape(-1, p.shape[-1]), 1, generator=gen).reshape(p.shape[:-1])


def verify(plogits: torch.Tensor, drafts: torch.Tensor, counts: torch.Tensor, q: torch.Tensor | None,
           temperature: float, gen: torch.Generator, synthetic_alpha: float | None = None,
           forced: torch.Tensor | None = None):
    """Accepted count n (b,) and the next token (b,) per sequence.

    plogits: target logits (b, k+1, vocab) at [pending, d1..dk]; drafts: proposed tokens (b, k); counts:
    real proposals per sequence (b,) (n-gram may propose fewer than k; the rest is padding and never
    accepted); q: draft probabilities (b, k, vocab), or None for deterministic proposals (one-hot);
    forced: draft tokens to accept per sequence (b,), e.g. from a replayed acceptance trace, capped by the
    real proposals (the text is then no longer the target's; the next token is the target's argmax there)."""
    b, k = drafts.shape
    dev = drafts.device
    live = torch.arange(k, device=dev)[None, :] < counts[:, None]
    rows = torch.arange(b, device=dev)
    if forced is not None:
        n = torch.minimum(forced.to(dev).clamp(min=0), counts)
        return n, plogits[rows, n].argmax(-1)
    if synthetic_alpha is not None:
        u = torch.rand(b, k, generator=gen, device=dev)
        n = ((u < synthetic_alpha) & live).long().cumprod(1).sum(1)
        return n, plogits[rows, n].argmax(-1)
    if temperature == 0:
        best = plogits.argmax(-1)
        n = ((drafts == best[:, :k]) & live).long().cumprod(1).sum(1)
        return n, best[rows, n]
    p = probs(plogits, temperature)  # (b, k+1, V)
    if q is None:
        q = torch.nn.functional.one_hot(drafts, p.shape[-1]).to(p.dtype)
    q = torch.where(live[..., None], q, torch.zeros_like(q))
    pd = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    qd = q.gather(-1, drafts[..., None]).squeeze(-1)
    u = torch.rand(b, k, generator=gen, device=dev, dtype=p.dtype)
    n = ((u * qd < pd) & live).long().cumprod(1).sum(1)
    qn = torch.cat([q, torch.zeros_like(p[:, :1])], 1)[rows, n]
    pn = p[rows, n]
    resid = (pn - qn).clamp(min=0)
    mass = resid.sum(-1, keepdim=True)
    resid = torch.where(mass > 0, resid / mass.clamp(min=1e-300), pn)
    return n, torch.multinomial(resid, 1, generator=gen).squeeze(-1)
