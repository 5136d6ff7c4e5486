"""Proposers: who guesses the k tokens the target verifies. Both keep whatever state they need per sequence
and follow the batch through join (prefill), select (retire) and clone.

  * NgramProposer: prompt lookup (ngram.py), no model, no state.
  * DraftProposer: a draft model run autoregressively for k tokens over its own KV cache. After a step its
    cache holds [pending, d1..d_{k-1}]; d_i stays valid iff it was accepted, and the next step feeds
    [d_k if all k were accepted, the target's next token] ("pending", with a validity mask).
"""
from __future__ import annotations

import numpy as np
import torch

from . import ngram, verify
from .kv import KVState, prefill


class NgramProposer:
    def __init__(self, k: int, max_n: int, min_n: int, match: str, pad: int, device):
        self.k, self.max_n, self.min_n, self.match, self.pad, self.device = k, max_n, min_n, match, pad, device

    def join(self, prompts: list[list[int]], first: torch.Tensor) -> None:
        pass

    def propose(self, seqs, temperature: float, gen: torch.Generator):
        """(tokens (b, k), real counts (b,), None): deterministic proposals have no draft distribution."""
        hist = [np.asarray(s.prompt + s.generated, dtype=np.int64) for s in seqs]
        toks, counts = ngram.propose(hist, self.k, self.max_n, self.min_n, pad=self.pad, match=self.match)
        return torch.from_numpy(toks).to(self.device), torch.from_numpy(counts).to(self.device), None

    def advance(self, drafts: torch.Tensor, n: torch.Tensor, nxt: torch.Tensor) -> None:
        pass

    def select(self, rows: torch.Tensor) -> None:
        pass

    def compact(self, after: int) -> None:
        pass

    def clone(self) -> "NgramProposer":
        return self


class DraftProposer:
    def __init__(self, model, k: int, pad: int, device):
        self.model, self.k, self.pad, self.device = model, k, pad, device
        self.kv = KVState(model)
        self.pend = torch.zeros(0, 2, dtype=torch.long, device=device)  # inputs not yet in the draft cache
        self.valid = torch.zeros(0, 2, dtype=torch.bool, device=device)

    def join(self, prompts: list[list[int]], first: torch.Tensor) -> None:
        """Prefill the draft on new prompts; their pending input is the target's first token."""
        kv, _ = prefill(self.model, prompts, self.pad, self.device)
        self.kv.merge(kv)
        self.pend = torch.cat([self.pend, torch.stack([torch.full_like(first, self.pad), first], 1)])
        self.valid = torch.cat([self.valid, torch.tensor([[False, True]] * len(prompts), device=self.device)])

    def propose(self, seqs, temperature: float, gen: torch.Generator):
        """(tokens (b, k), counts (b,) = k, draft probabilities (b, k, vocab) or None when greedy)."""
        b, k = len(seqs), self.k
        # a 2-token forward costs more than a 1-token one: skip the first column when no sequence needs it
        pend, valid = (self.pend, self.valid) if bool(self.valid[:, 0].any()) else (self.pend[:, 1:],
                                                                                     self.valid[:, 1:])
        logits = self.kv.forward(pend, valid, last_only=True)[:, -1]
        one = torch.ones(b, 1, dtype=torch.bool, device=self.device)
        toks, q = [], []
        for i in range(k):
            if temperature > 0:
                q.append(verify.probs(logits, temperature))
            toks.append(verify.sample(logits, temperature, gen))
            if i < k - 1:
                logits = self.kv.forward(toks[-1][:, None], one, last_only=True)[:, -1]
        return (torch.stack(toks, 1), torch.full((b,), k, dtype=torch.long, device=self.device),
                torch.stack(q, 1) if q else None)

    def advance(self, drafts: torch.Tensor, n: torch.Tensor, nxt: torch.Tensor) -> None:
        k = self.k
        self.kv.invalidate(self.kv.slots - (k - 1), n, k - 1)
        full = n == k
        self.pend = torch.stack([torch.where(full, drafts[:, -1], self.pad), nxt], 1)
        self.valid = torch.stack([full, torch.ones_like(full)], 1)

    def select(self, rows: torch.Tensor) -> None:
        self.kv.select(rows)
        self.pend, self.valid = self.pend[rows], self.valid[rows]

    def compact(self, after: int) -> None:
        if self.kv.holes() >= after:
            self.kv.compact()

    def clone(self) -> "DraftProposer":
        import copy

        new = copy.copy(self)
        new.kv, new.pend, new.valid = self.kv.clone(), self.pend.clone(), self.valid.clone()
        return new
