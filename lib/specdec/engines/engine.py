"""Batched speculative decoding with torch + transformers: the scheduler (SpecEngine) and static batches.

One engine serves both sides of every comparison:
  * k = 0 (or proposer "none"): plain batched decoding with the target, one token per step;
  * proposer "draft": a draft model proposes k tokens autoregressively, the target verifies k+1 in one pass;
  * proposer "ngram": prompt lookup proposes up to k tokens, no draft model.
Verification is greedy (temperature 0: accept while the draft token is the target's argmax) or lossless
rejection sampling (accept d with prob min(1, p(d)/q(d)), else resample from norm(max(0, p - q))).
Acceptance is per sequence; caches stay consistent through KVState holes. Times are seconds.
Roles: engine.py schedules (batch state, admission, steps), proposers.py proposes, verify.py verifies (pure
functions), kv.py holds caches, timing.py is the one synchronized clock.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, fields

import torch

from ..data.spec import FINISHED_RULES, PROPOSERS, VERIFY_WIDTHS, Cell, Generation, proposer_names
from ..errors import SpecdecError
from . import ngram, ragged, verify
from .kv import KVState
from .kv import prefill as prefill_kv
from .proposers import DraftProposer, NgramProposer
from .timing import clock, sync


@dataclass(frozen=True)
class GenConfig(Generation):
    """What the engine runs one cell with: the study's generation settings (spec.Generation: max_new_tokens,
    temperature, ignore_eos, n-gram lookup, the trace collection) plus the cell's k, proposer and seed, and the
    engine's own settings. Built once per cell (from_cell); tests build it directly, where ngram_match defaults
    to vLLM's rule. k: proposed tokens per step; temperature 0 means greedy; max_new_tokens per sequence."""

    k: int = 4
    proposer: str = "draft"  # draft | eagle (a draft model that is an EAGLE-sized head) | ngram | none
    seed: int = 0
    ngram_match: str = "earliest"  # earliest (vLLM's rule) | latest: which earlier occurrence n-gram lookup copies
    compact_after: int = 32  # compact a cache once it has this many hole columns
    synthetic_alpha: float | None = None  # force i.i.d. acceptance with this probability (cost studies)
    # replayed acceptance (cost studies with real traces; the collection is acceptance_trace): acc_len per output
    # position for each request; the sequence with rid r follows trace r % len, and a step starting at output
    # position i (tokens generated so far; the prefill gave position 0) accepts min(acc_len[i-1], k+1) - 1 drafted
    # tokens, as the paper's simulator replays them (traces.steps). Past the end of its trace a sequence wraps
    # around. Every sequence then counts as proposing k tokens (k+1 are verified anyway): an n-gram miss does not
    # cap the replay.
    replay: tuple[tuple[int, ...], ...] | None = None
    # tokens verified per sequence per step (the study's torch.verify): "k" = k+1 always (short proposals
    # padded); "proposed" = 1 + the longest real proposal in the batch; "ragged" = that width, with the target's
    # Linears computing only each sequence's real tokens (ragged.py). Replayed cells always verify k+1.
    verify: str = "k"
    # a static batch's finished sequences (the study's torch.finished): "keep" them in the batch to its last step
    # (computed, discarded) or "retire" them after the step that finished them (decode), as vLLM does
    finished: str = "keep"

    @classmethod
    def from_cell(cls, gen: Generation, cell: Cell, seed: int, verify: str = "k",
                  finished: str = "keep") -> "GenConfig":
        """A cell's settings: the study's generation section, the cell's k, proposer, temperature and forced
        acceptance (alpha), the run's seed and the torch engine's verify width and finished rule; checked."""
        own = {f.name: getattr(gen, f.name) for f in fields(Generation)}
        own.update(k=cell.k, proposer=cell.proposer, temperature=cell.temperature, seed=seed,
                   synthetic_alpha=cell.alpha, verify=verify, finished=finished)
        return cls(**own).validate()

    def validate(self) -> "GenConfig":
        if self.k < 0:
            raise SpecdecError(f"k must be >= 0, got {self.k}")
        if self.proposer not in proposer_names("torch"):
            raise SpecdecError(f"unknown proposer '{self.proposer}' ({', '.join(proposer_names('torch'))})")
        if self.max_new_tokens < 1:
            raise SpecdecError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.synthetic_alpha is not None and not 0 <= self.synthetic_alpha <= 1:
            raise SpecdecError(f"synthetic_alpha must be in [0, 1], got {self.synthetic_alpha}")
        if self.replay is not None:
            if self.synthetic_alpha is not None:
                raise SpecdecError("synthetic_alpha and a replayed acceptance trace exclude each other")
            if not self.replay or not all(
                    len(t) and all(isinstance(v, int) and v >= 1 for v in t) for t in self.replay):
                raise SpecdecError("a replayed acceptance trace must hold non-empty acc_len lists of integers >= 1")
        if self.verify not in VERIFY_WIDTHS:
            raise SpecdecError(f"verify must be one of {', '.join(VERIFY_WIDTHS)}, got '{self.verify}'")
        if self.finished not in FINISHED_RULES:
            raise SpecdecError(f"finished must be one of {', '.join(FINISHED_RULES)}, got '{self.finished}'")
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


class SpecEngine:
    """The scheduler: holds a batch of sequences (admission, retirement) and advances all of them one
    speculative step at a time: propose (proposers.py), verify in one target pass (verify.py, pure), commit.
    Timing goes through timing.clock."""

    def __init__(self, target, draft=None, cfg: GenConfig | None = None, eos_token_id=None, pad_token_id=0):
        self.cfg = (cfg or GenConfig()).validate()
        model_based = PROPOSERS[self.cfg.proposer].cost == "draft forward"  # a draft model (or head) proposes
        if model_based and self.cfg.k > 0 and draft is None:
            raise SpecdecError(f"proposer '{self.cfg.proposer}' needs a draft model")
        self.target, self.draft = target, draft
        if self.cfg.verify == "ragged":  # transparent outside ragged.only (idempotent)
            ragged.apply(target)
        self.device = next(target.parameters()).device
        self.eos = eos_token_id
        self.pad = pad_token_id
        self.gen = torch.Generator(device=self.device).manual_seed(self.cfg.seed)
        self.tkv = KVState(target)
        self.proposer = None
        if self.cfg.speculative:
            self.proposer = (DraftProposer(draft, self.cfg.k, self.pad, self.device) if model_based
                             else NgramProposer(self.cfg.k, self.cfg.ngram_max, self.cfg.ngram_min,
                                                self.cfg.ngram_match, self.pad, self.device))
        self.seqs: list[Sequence] = []
        self.retired: list[Sequence] = []  # sequences retire() dropped from the batch, in the order they left
        self.last = torch.zeros(0, dtype=torch.long, device=self.device)  # pending token, not yet in target cache
        self.steps: list[dict] = []
        self.t0 = time.perf_counter()

    # -- admission -------------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    @torch.no_grad()
    def add(self, seqs: list[Sequence]) -> float:
        """Prefill new sequences and join them to the running batch. Returns the prefill seconds."""
        if not seqs:
            return 0.0
        if any(len(s.prompt) == 0 for s in seqs):
            raise SpecdecError("empty prompt")
        start = clock(self.device)
        prompts = [s.prompt for s in seqs]
        tkv, logits = prefill_kv(self.target, prompts, self.pad, self.device)
        first = verify.sample(logits, self.cfg.temperature, self.gen)
        if self.proposer is not None:
            self.proposer.join(prompts, first)
        self.tkv.merge(tkv)
        self.last = torch.cat([self.last, first])
        sync(self.device)
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
        new.proposer = self.proposer.clone() if self.proposer is not None else None
        new.seqs = [copy.deepcopy(s) for s in self.seqs]
        new.retired = [copy.deepcopy(s) for s in self.retired]
        new.last = self.last.clone()
        new.steps = []
        new.gen = torch.Generator(device=self.device).manual_seed(self.cfg.seed if seed is None else seed)
        new.t0 = time.perf_counter() - self.now()
        return new

    def retire(self) -> list[Sequence]:
        """Drop finished sequences from the batch (continuous batching, or a static batch whose cfg.finished is
        "retire"); returns them (they are also kept in self.retired: self.requests lists every sequence)."""
        keep = [i for i, s in enumerate(self.seqs) if not s.done]
        gone = [s for s in self.seqs if s.done]
        if gone:
            rows = torch.tensor(keep, dtype=torch.long, device=self.device)
            self.tkv.select(rows)
            if self.proposer is not None:
                self.proposer.select(rows)
            self.last = self.last[rows]
            self.seqs = [self.seqs[i] for i in keep]
            self.retired += gone
        return gone

    @property
    def requests(self) -> list[Sequence]:
        """Every sequence this engine admitted, in the batch or retired, by rid (a static batch: prompt order)."""
        return sorted(self.seqs + self.retired, key=lambda s: s.rid)

    def _commit(self, s: Sequence, toks: list[int], now: float) -> None:
        if s.done:
            return
        for t in toks:
            s.generated.append(int(t))
            if len(s.generated) >= s.max_new or (not self.cfg.ignore_eos and t == self.eos):
                s.done, s.finish_s = True, now
                return

    # -- one step --------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> dict:
        """Advance every sequence in the batch by one (speculative) step; returns the step record."""
        if not self.seqs:
            raise SpecdecError("step() on an empty batch")
        cfg, b = self.cfg, len(self.seqs)
        t0 = clock(self.device)
        if self.proposer is not None:
            drafts, counts, q = self.proposer.propose(self.seqs, cfg.temperature, self.gen)
        else:
            drafts = torch.zeros(b, 0, dtype=torch.long, device=self.device)
            counts, q = torch.zeros(b, dtype=torch.long, device=self.device), None
        k = drafts.shape[1]
        if cfg.replay is not None:  # replay: every sequence proposed k (an n-gram miss is padding)
            counts = torch.full_like(counts, k)
        elif cfg.verify != "k" and k and int(counts.max()) < k:  # verify only what was proposed
            k = int(counts.max())
            drafts = drafts[:, :k]
        t1 = clock(self.device)
        start = self.tkv.slots
        verify_in = torch.cat([self.last[:, None], drafts], 1)
        valid, rows = torch.ones_like(verify_in, dtype=torch.bool), nullcontext()
        if cfg.verify == "ragged" and cfg.replay is None and int(counts.min()) < k:  # padded proposals: holes,
            valid = torch.arange(k + 1, device=self.device)[None, :] <= counts[:, None]  # not multiplied
            rows = ragged.only(valid)
        with rows:
            plogits = self.tkv.forward(verify_in, valid)
        t2 = clock(self.device)
        n, nxt = verify.verify(plogits, drafts, counts, q, cfg.temperature, self.gen, cfg.synthetic_alpha,
                               self._forced(k))
        self.tkv.invalidate(start + 1, n, k)
        if self.proposer is not None:
            self.proposer.advance(drafts, n, nxt)
            self.proposer.compact(cfg.compact_after)
        self.last = nxt
        if self.tkv.holes() >= cfg.compact_after:
            self.tkv.compact()
        n_list, d_list, c_list, nxt_list = n.tolist(), drafts.tolist(), counts.tolist(), nxt.tolist()
        sync(self.device)
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

    def _forced(self, k: int) -> torch.Tensor | None:
        """Draft tokens each sequence accepts this step under a replayed trace (None: verify decides)."""
        traces = self.cfg.replay
        if traces is None:
            return None
        out = []
        for s in self.seqs:
            tr = traces[s.rid % len(traces)]
            pos = max(len(s.generated), 1)  # output position this step starts at (1 after the prefill token)
            out.append(min(tr[(pos - 1) % len(tr)], k + 1) - 1)
        return torch.tensor(out, dtype=torch.long, device=self.device)

    def all_done(self) -> bool:
        return all(s.done for s in self.seqs)


def prefill(target, draft, prompts: list[list[int]], cfg: GenConfig, eos_token_id=None, pad_token_id=0):
    """A static batch after its prefill: (engine, prefill seconds)."""
    eng = SpecEngine(target, draft, cfg, eos_token_id, pad_token_id)
    prefill_s = eng.add([Sequence(i, list(p), cfg.max_new_tokens) for i, p in enumerate(prompts)])
    return eng, prefill_s


def decode(eng: SpecEngine, max_steps: int | None = None) -> float:
    """Step until every sequence is done (or max_steps); returns the decode seconds. Under cfg.finished
    "retire" a sequence that finished leaves the batch after that step (eng.requests still lists it)."""
    t = clock(eng.device)
    retire = eng.cfg.finished == "retire"
    while not eng.all_done() and (max_steps is None or len(eng.steps) < max_steps):
        eng.step()
        if retire and not eng.all_done():
            eng.retire()
    return clock(eng.device) - t


def generate(target, draft, prompts: list[list[int]], cfg: GenConfig, eos_token_id=None, pad_token_id=0):
    """Static batching: prefill all prompts together, step until every sequence has max_new_tokens.

    Returns (engine, prefill seconds, decode seconds); the sequences are engine.requests, in prompt order."""
    eng, prefill_s = prefill(target, draft, prompts, cfg, eos_token_id, pad_token_id)
    return eng, prefill_s, decode(eng)
