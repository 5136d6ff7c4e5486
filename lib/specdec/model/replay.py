"""Predicted speedups by replaying per-position traces (traces.py) through a cost model (costmodel.py).

The protocol is the paper's simulator's (SpecDecode-Bench/simulator, `simulate_like_experiment`), written
anew: each traced request is served as a static batch of `batch` copies of itself; the prefill (one target
forward over every prompt token) is counted when `prefill` is set; every step adds the cost model's
step overhead. Without SD the batch takes G-1 one-token steps; with SD and k proposals a step starting at
output position i emits min(acc_len[i], k+1) tokens (no independence assumption: the trace says what a
step starting exactly there would emit). KV tokens grow with what each step emits. Speedup = mean over
requests of throughput with SD / mean over requests of throughput without (the simulator's "speedup by
tpt"); intervals are percentile bootstraps over requests.

n-gram steps that propose nothing: where acc_len = 1 the lookup may have found no match and then verifies
one token and costs nothing; the collection records P(match | acc_len = 1) per dataset (the simulator's
constants, not fitted here). Positions with acc_len > 1 always had a match. The expected cost over that
coin is used (the cost model is linear in tokens, so this is the simulator's mean).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from ..data import traces as tr
from ..errors import SpecdecError
from .costmodel import CostModel

N_SAMPLE = 300  # requests drawn per dataset, as in the simulator
SEED = 42


def sample(ts: tr.TraceSet, n: int = N_SAMPLE, seed: int = SEED) -> list[tr.Request]:
    """The simulator's request sample: Python's random.sample(requests, n) after seeding `seed`."""
    import random

    reqs = [r for r in ts.requests if r.generated_len > 0]
    return random.Random(seed).sample(reqs, k=min(n, len(reqs)))


@lru_cache(maxsize=4096)
def _replayed(acc_len: tuple[int, ...], k: int):
    return tr.steps(acc_len, k)


def _latencies(req: tr.Request, costs: CostModel, batch: int, k: int, proposer: str, match_prob: float | None,
               prefill: bool) -> tuple[float, float]:
    """(seconds without SD, seconds with SD at k) for one request served as `batch` copies."""
    P, G = req.prompt_len, req.generated_len
    pre = float(costs.forward_s("target", batch, P, 0)) if prefill else 0.0
    ovh = costs.overhead_s
    # no SD: G-1 steps of one token each; context grows from P+1 by one per step
    ctx = P + 1 + np.arange(max(G - 1, 0))
    org = pre + ovh + float(np.sum(costs.forward_s("target", batch, 1, ctx))) + ovh * len(ctx)
    if k == 0:
        return org, org
    starts, emitted = _replayed(req.acc_len, k)
    ctx = P + 1 + np.concatenate([[0], np.cumsum(emitted)[:-1]]) if len(emitted) else np.zeros(0)
    acc = np.asarray(req.acc_len)[starts - 1] if len(starts) else np.zeros(0)
    if proposer == "ngram" and match_prob is not None:
        matched = np.where(acc > 1, 1.0, match_prob)  # P(the lookup proposed k tokens) at each step
    else:
        matched = np.ones(len(starts))
    verify_k = costs.forward_s("target", batch, k + 1, ctx)
    verify_1 = costs.forward_s("target", batch, 1, ctx)
    draft = costs.draft_s(batch, k, ctx, proposer, verify_k)
    step = matched * (verify_k + draft) + (1 - matched) * verify_1 + ovh
    sd = pre + ovh + float(np.sum(step))
    return org, sd


def request_latencies(ts: tr.TraceSet, costs: CostModel, batch: int, k: int, prefill: bool = True,
                      n: int = N_SAMPLE, seed: int = SEED, requests: list[tr.Request] | None = None) -> pd.DataFrame:
    """Per sampled request (or per given `requests`): generated tokens G, seconds without SD (org_s) and with
    SD at k (sd_s)."""
    if batch < 1:
        raise SpecdecError(f"batch must be >= 1, got {batch}")
    if k > ts.max_k:
        raise SpecdecError(f"{ts.name}/{ts.dataset} traces are capped at k = {ts.max_k}, asked for k = {k}")
    rows = []
    for r in (requests if requests is not None else sample(ts, n, seed)):
        org, sd = _latencies(r, costs, batch, k, ts.proposer, ts.match_prob, prefill)
        rows.append({"id": r.id, "tokens": r.generated_len, "org_s": org, "sd_s": sd})
    return pd.DataFrame(rows)


def _ratio(tokens, org, sd) -> float:
    return float(np.mean(tokens / sd) / np.mean(tokens / org))


def speedup(ts: tr.TraceSet, costs: CostModel, batch: int, k: int, prefill: bool = True, n_boot: int = 200,
            level: float = 0.95, seed: int = 0) -> dict:
    """Predicted speedup at (batch, k) with a bootstrap interval over requests; also tokens per step."""
    reqs = sample(ts)
    lat = request_latencies(ts, costs, batch, k, prefill, requests=reqs)
    t, o, s = (lat[c].to_numpy(float) for c in ("tokens", "org_s", "sd_s"))
    point = _ratio(t, o, s)
    lo = hi = point
    if k and n_boot > 0:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, len(t), size=(n_boot, len(t)))
        boots = np.mean(t[idx] / s[idx], 1) / np.mean(t[idx] / o[idx], 1)
        tail = (1 - level) / 2 * 100
        lo, hi = np.percentile(boots, [tail, 100 - tail])
    steps = sum(len(_replayed(r.acc_len, k)[0]) for r in reqs) if k else None
    toks = sum(r.generated_len - 1 for r in reqs)
    return {"speedup": point, "ci_lo": float(lo), "ci_hi": float(hi),
            "tokens_per_step": (toks / steps) if steps else 1.0}
