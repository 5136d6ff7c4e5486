"""Batched speculative decoding with torch + transformers.

One engine serves both sides of every comparison:
  * k = 0 (or proposer "none"): plain batched decoding with the target, one token per step;
  * proposer "draft": a draft model proposes k tokens autoregressively, the target verifies k+1 in one pass;
  * proposer "ngram": prompt lookup proposes up to k tokens, no draft model.
Verification is greedy (temperature 0: accept while the draft token is the target's argmax) or lossless
rejection sampling (accept d with prob min(1, p(d)/q(d)), else resample from norm(max(0, p - q))).
Acceptance is per sequence; caches stay consistent through KVState holes. Times are seconds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from . import ngram
from .errors import SpecdecError
from .kv import KVState


@dataclass
class GenConfig:
    """k: proposed tokens per step; temperature 0 means greedy; max_new_tokens per sequence."""

    k: int = 4
    proposer: str = "draft"  # draft | ngram | none
    max_new_tokens: int = 32
    temperature: float = 0.0
    seed: int = 0
    ignore_eos: bool = True
    ngram_max: int = 3
    ngram_min: int = 1
    ngram_match: str = "earliest"  # earliest (vLLM's rule) | latest: which earlier occurrence n-gram lookup copies
    compact_after: int = 32  # compact a cache once it has this many hole columns
    synthetic_alpha: float | None = None  # force i.i.d. acceptance with this probability (cost studies)

    def validate(self) -> "GenConfig":
        if self.k < 0:
            raise SpecdecError(f"k must be >= 0, got {self.k}")
        if self.proposer not in ("draft", "ngram", "none"):
            raise SpecdecError(f"unknown proposer '{self.proposer}' (draft, ngram, none)")
        if self.max_new_tokens < 1:
            raise SpecdecError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.synthetic_alpha is not None and not 0 <= self.synthetic_alpha <= 1:
            raise SpecdecError(f"synthetic_alpha must be in [0, 1], got {self.synthetic_alpha}")
        if self.ngram_match not in ngram.MATCH_RULES:
            raise SpecdecError(f"unknown ngram_match '{self.ngram_match}' ({', '.join(ngram.MATCH_RULES)})")
        if self.temperature < 0:
            raise SpecdecError(f"temperature must be >= 0, got {self.temperature}")
        return self

    @property
    def speculative(self) -> bool:
        return self.k > 0 and self.proposer != "none"


@dataclass
class Sequence:
    """One request: prompt ids, generated ids, and when (seconds from engine start) things happened."""

    rid: int
    prompt: list[int]
    max_new: int
    generated: list[int] = field(default_factory=list)
    done: bool = False
    arrival_s: float = 0.0
    admitted_s: float = 0.0
    first_token_s: float = 0.0
    finish_s: float = 0.0


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class SpecEngine:
    """Holds a batch of sequences and advances all of them one speculative step at a time."""

    def __init__(self, target, draft=None, cfg: GenConfig | None = None, eos_token_id=None, pad_token_id=0):
        self.cfg = (cfg or GenConfig()).validate()
        if self.cfg.proposer == "draft" and self.cfg.k > 0 and draft is None:
            raise SpecdecError("proposer 'draft' needs a draft model")
        self.target, self.draft = target, draft
        self.device = next(target.parameters()).device
        self.eos = eos_token_id
        self.pad = pad_token_id
        self.gen = torch.Generator(device=self.device).manual_seed(self.cfg.seed)
        self.tkv = KVState(target)
        self.dkv = KVState(draft) if (self.cfg.speculative and self.cfg.proposer == "draft") else None
        self.seqs: list[Sequence] = []
        self.last = torch.zeros(0, dtype=torch.long, device=self.device)  # pending token, not yet in target cache
        self.dpend = torch.zeros(0, 2, dtype=torch.long, device=self.device)  # pending draft inputs
        self.dvalid = torch.zeros(0, 2, dtype=torch.bool, device=self.device)
        self.steps: list[dict] = []
        self.t0 = time.perf_counter()

    # -- admission -------------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _prefill(self, model, prompts, last_only=True):
        kv = KVState(model)
        width = max(len(p) for p in prompts)
        toks = torch.full((len(prompts), width), self.pad, dtype=torch.long, device=self.device)
        valid = torch.zeros(len(prompts), width, dtype=torch.bool, device=self.device)
        for i, p in enumerate(prompts):
            toks[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            valid[i, width - len(p):] = True
        logits = kv.forward(toks, valid, last_only=last_only)[:, -1]
        return kv, logits

    @torch.no_grad()
    def add(self, seqs: list[Sequence]) -> float:
        """Prefill new sequences and join them to the running batch. Returns the prefill seconds."""
        if not seqs:
            return 0.0
        if any(len(s.prompt) == 0 for s in seqs):
            raise SpecdecError("empty prompt")
        _sync(self.device)
        start = time.perf_counter()
        prompts = [s.prompt for s in seqs]
        tkv, logits = self._prefill(self.target, prompts)
        first = self._sample(logits)
        if self.dkv is not None:
            dkv, _ = self._prefill(self.draft, prompts)
            self.dkv.merge(dkv)
        self.tkv.merge(tkv)
        self.last = torch.cat([self.last, first])
        pend = torch.stack([torch.full_like(first, self.pad), first], dim=1)
        self.dpend = torch.cat([self.dpend, pend])
        self.dvalid = torch.cat([self.dvalid, torch.tensor([[False, True]] * len(seqs), device=self.device)])
        _sync(self.device)
        now = self.now()
        for s, tok in zip(seqs, first.tolist()):
            s.admitted_s, s.first_token_s = start - self.t0, now
            self._commit(s, [tok], now)
        self.seqs.extend(seqs)
        return time.perf_counter() - start

    def clone(self, seed: int | None = None) -> "SpecEngine":
        """An independent copy of the running state (caches, pending tokens, sequences), steps cleared, its
        clock continuing from this one's. Used to time several decodes from one prefill."""
        import copy

        new = copy.copy(self)
        new.tkv = self.tkv.clone()
        new.dkv = self.dkv.clone() if self.dkv is not None else None
        new.seqs = [copy.deepcopy(s) for s in self.seqs]
        new.last, new.dpend, new.dvalid = self.last.clone(), self.dpend.clone(), self.dvalid.clone()
        new.steps = []
        new.gen = torch.Generator(device=self.device).manual_seed(self.cfg.seed if seed is None else seed)
        new.t0 = time.perf_counter() - self.now()
        return new

    def retire(self) -> list[Sequence]:
        """Drop finished sequences from the batch (continuous batching); returns them."""
        keep = [i for i, s in enumerate(self.seqs) if not s.done]
        gone = [s for s in self.seqs if s.done]
        if gone:
            rows = torch.tensor(keep, dtype=torch.long, device=self.device)
            self.tkv.select(rows)
            if self.dkv is not None:
                self.dkv.select(rows)
            self.last, self.dpend, self.dvalid = self.last[rows], self.dpend[rows], self.dvalid[rows]
            self.seqs = [self.seqs[i] for i in keep]
        return gone

    # -- sampling --------------------------------------------------------------------------------
    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.double() / self.cfg.temperature, dim=-1)

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        if self.cfg.temperature == 0:
            return logits.argmax(-1)
        probs = self._probs(logits)
        return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=self.gen).reshape(probs.shape[:-1])

    def _commit(self, s: Sequence, toks: list[int], now: float) -> None:
        if s.done:
            return
        for t in toks:
            s.generated.append(int(t))
            if len(s.generated) >= s.max_new or (not self.cfg.ignore_eos and t == self.eos):
                s.done, s.finish_s = True, now
                return

    # -- one step --------------------------------------------------------------------------------
    def _propose(self):
        """Returns proposed tokens (b, k), real counts (b,), and draft probs (b, k, vocab) or None."""
        b, k = len(self.seqs), self.cfg.k
        if self.cfg.proposer == "ngram":
            hist = [np.asarray(s.prompt + s.generated, dtype=np.int64) for s in self.seqs]
            toks, counts = ngram.propose(hist, k, self.cfg.ngram_max, self.cfg.ngram_min, pad=self.pad,
                                          match=self.cfg.ngram_match)
            return (torch.from_numpy(toks).to(self.device), torch.from_numpy(counts).to(self.device), None)
        logits = self.dkv.forward(self.dpend, self.dvalid, last_only=True)[:, -1]
        toks, probs = [], []
        for i in range(k):
            if self.cfg.temperature > 0:
                probs.append(self._probs(logits))
            toks.append(self._sample(logits))
            if i < k - 1:
                logits = self.dkv.forward(toks[-1][:, None], torch.ones(b, 1, dtype=torch.bool,
                                                                        device=self.device), last_only=True)[:, -1]
        q = torch.stack(probs, 1) if probs else None
        return torch.stack(toks, 1), torch.full((b,), k, dtype=torch.long, device=self.device), q

    def _verify(self, plogits, drafts, counts, q):
        """Per-sequence accepted count n (b,) and the token that follows them (b,)."""
        b, k = drafts.shape
        live = torch.arange(k, device=self.device)[None, :] < counts[:, None]
        rows = torch.arange(b, device=self.device)
        if self.cfg.synthetic_alpha is not None:
            # same work as real SD, but acceptance is drawn i.i.d.; the text is no longer the target's
            u = torch.rand(b, k, generator=self.gen, device=self.device)
            n = ((u < self.cfg.synthetic_alpha) & live).long().cumprod(1).sum(1)
            return n, plogits[rows, n].argmax(-1)
        if self.cfg.temperature == 0:
            best = plogits.argmax(-1)
            ok = (drafts == best[:, :k]) & live
            n = ok.long().cumprod(1).sum(1)
            return n, best[rows, n]
        p = self._probs(plogits)  # (b, k+1, V)
        if q is None:  # deterministic proposals (n-gram): q is one-hot on the proposed token
            q = torch.nn.functional.one_hot(drafts, p.shape[-1]).to(p.dtype)
        q = torch.where(live[..., None], q, torch.zeros_like(q))
        pd = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
        qd = q.gather(-1, drafts[..., None]).squeeze(-1)
        u = torch.rand(b, k, generator=self.gen, device=self.device, dtype=p.dtype)
        ok = (u * qd < pd) & live
        n = ok.long().cumprod(1).sum(1)
        qn = torch.cat([q, torch.zeros_like(p[:, :1])], 1)[rows, n]
        pn = p[rows, n]
        resid = (pn - qn).clamp(min=0)
        mass = resid.sum(-1, keepdim=True)
        resid = torch.where(mass > 0, resid / mass.clamp(min=1e-300), pn)
        return n, torch.multinomial(resid, 1, generator=self.gen).squeeze(-1)

    @torch.no_grad()
    def step(self) -> dict:
        """Advance every sequence in the batch by one (speculative) step; returns the step record."""
        if not self.seqs:
            raise SpecdecError("step() on an empty batch")
        cfg, b = self.cfg, len(self.seqs)
        _sync(self.device)
        t0 = time.perf_counter()
        if cfg.speculative:
            drafts, counts, q = self._propose()
            k = drafts.shape[1]
        else:
            drafts = torch.zeros(b, 0, dtype=torch.long, device=self.device)
            counts, q, k = torch.zeros(b, dtype=torch.long, device=self.device), None, 0
        _sync(self.device)
        t1 = time.perf_counter()
        start = self.tkv.slots
        verify_in = torch.cat([self.last[:, None], drafts], 1)
        plogits = self.tkv.forward(verify_in, torch.ones_like(verify_in, dtype=torch.bool))
        _sync(self.device)
        t2 = time.perf_counter()
        n, nxt = self._verify(plogits, drafts, counts, q)
        self.tkv.invalidate(start + 1, n, k)
        if self.dkv is not None:
            # the draft cache holds [pending, d1..d_{k-1}]; d_i stays valid iff accepted
            self.dkv.invalidate(self.dkv.slots - (k - 1), n, k - 1)
            full = n == k
            self.dpend = torch.stack([torch.where(full, drafts[:, -1], self.pad), nxt], 1)
            self.dvalid = torch.stack([full, torch.ones_like(full)], 1)
        self.last = nxt
        for kv in (self.tkv, self.dkv):
            if kv is not None and kv.holes() >= cfg.compact_after:
                kv.compact()
        n_list, d_list, c_list, nxt_list = n.tolist(), drafts.tolist(), counts.tolist(), nxt.tolist()
        _sync(self.device)
        now = self.now()
        active = []
        for s, ni, ds, tok in zip(self.seqs, n_list, d_list, nxt_list):
            active.append(not s.done)
            self._commit(s, ds[:ni] + [tok], now)
        t3 = time.perf_counter()
        rec = {"step": len(self.steps), "batch": b, "draft_s": t1 - t0, "verify_s": t2 - t1,
               "other_s": t3 - t2, "accepted": n_list, "proposed": c_list, "active": active,
               "rids": [s.rid for s in self.seqs], "end_s": now}
        self.steps.append(rec)
        return rec

    def all_done(self) -> bool:
        return all(s.done for s in self.seqs)


def prefill(target, draft, prompts: list[list[int]], cfg: GenConfig, eos_token_id=None, pad_token_id=0):
    """A static batch after its prefill: (engine, prefill seconds)."""
    eng = SpecEngine(target, draft, cfg, eos_token_id, pad_token_id)
    prefill_s = eng.add([Sequence(i, list(p), cfg.max_new_tokens) for i, p in enumerate(prompts)])
    return eng, prefill_s


def decode(eng: SpecEngine, max_steps: int | None = None) -> float:
    """Step until every sequence is done (or max_steps); returns the decode seconds."""
    _sync(eng.device)
    t = time.perf_counter()
    while not eng.all_done() and (max_steps is None or len(eng.steps) < max_steps):
        eng.step()
    _sync(eng.device)
    return time.perf_counter() - t


def generate(target, draft, prompts: list[list[int]], cfg: GenConfig, eos_token_id=None, pad_token_id=0):
    """Static batching: prefill all prompts together, step until every sequence has max_new_tokens.

    Returns (engine, prefill seconds, decode seconds); the sequences are engine.seqs in prompt order."""
    eng, prefill_s = prefill(target, draft, prompts, cfg, eos_token_id, pad_token_id)
    return eng, prefill_s, decode(eng)
