"""Predicted SD speedup, optimal k per batch size, break-even acceptance (pure model: no measured cell is read
here except acceptance traces; advice and validation on measured cells are report/advise.py).

Steady state (continuous decoding, one step for every sequence of a batch of `batch`):
    t_sd   = draft (first forward 2 tokens/seq, then k-1 of 1) + verify (k+1 tokens/seq) + overhead   [s]
             (an n-gram lookup: its share of the verify, which checks 1 + the tokens it really proposed: sd_step_s)
    t_base = one target forward of 1 token/seq + overhead                                             [s]
    speedup = (E[tokens/step] / t_sd) / (1 / t_base)
with E[tokens/step] from the acceptance model (acceptance.py) and forward times from the cost model
(costmodel.py). Intervals: percentile bootstrap over requests of the acceptance traces and over the
cost fit's relative residuals (or the prior's efficiency ranges). `context` is KV tokens per sequence.

Policy output follows vLLM's Dynamic Speculative Decoding option (docs/features/speculative_decoding/
dynamic_speculative_decoding.md in vllm-project/vllm): `num_speculative_tokens_per_batch_size` is a list of
[start_bs, end_bs, k] entries (k draft tokens while the number of running sequences is in [start_bs,
end_bs]; k = 0 turns drafting off), each k <= `num_speculative_tokens`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import brentq

from ..data.spec import Generation, Study, proposer_names
from ..errors import SpecdecError
from . import acceptance
from .acceptance import AcceptanceModel
from .costmodel import CostModel

DEFAULT_CONTEXT = 512  # KV tokens per sequence when none is given
K_MAX = 8              # largest k searched
MAX_BATCH = 256        # policy range (vLLM's usual max_num_seqs)
ADVISE_MAX_BATCH = 4096  # largest batch advise evaluates (its policy arrays grow with the batch)
MAX_TOKENS = 1e7       # largest context / prompt / output length advise accepts [tokens]


def speedup(costs: CostModel, acc: AcceptanceModel, batch, k: int, context=DEFAULT_CONTEXT,
            proposer: str = "draft", extrapolate: bool = False, verify: str = "ragged"):
    """Steady-state speedup of SD with k over no SD (1.0 for k = 0); batch may be an array."""
    if k == 0:
        return np.ones_like(np.asarray(batch, dtype=float)) if np.ndim(batch) else 1.0
    tokens = acc.expected_tokens(k, extrapolate)
    return tokens * costs.step_s(batch, 0, context) / sd_step_s(costs, acc, batch, k, context, proposer,
                                                                extrapolate, verify)


def sd_step_s(costs: CostModel, acc, batch, k: int, context, proposer: str = "draft", extrapolate: bool = False,
              verify: str = "ragged"):
    """Mean seconds of an SD step. A draft model always proposes k: the target verifies k+1 tokens per sequence.
    An n-gram lookup may propose fewer, or nothing: with per-step proposal lengths in the traces
    (AcceptanceModel.verify_width) the step verifies the mean width under the engine's `verify` rule ("ragged":
    vLLM, and the torch engine's verify: ragged; "proposed"; "k": padded to k+1), a step in which no sequence
    proposed anything being a 1-token forward; with only whether a step proposed (ReplayAcceptance.
    propose_fraction, the paper's traces) a proposing step verifies k+1 and the others cost a plain step."""
    if proposer != "ngram":
        return costs.step_s(batch, k, context, proposer)
    if hasattr(acc, "propose_fraction"):
        f = acc.propose_fraction(k)
        return f * costs.step_s(batch, k, context, proposer) + (1 - f) * costs.step_s(batch, 0, context)
    if not hasattr(acc, "verify_width") or verify == "k":
        return costs.step_s(batch, k, context, proposer)
    width = acc.verify_width(k, batch, verify, extrapolate)
    # no sequence of the batch proposes (proposals independent): a 1-token forward (a cost model's jump from 1 to
    # more query rows is charged only to the steps that verify more)
    none = (1.0 - float(acc.proposal_survival(k, extrapolate)[0])) ** np.asarray(batch, dtype=float)
    some = np.where(none < 1, (width - none) / np.maximum(1 - none, 1e-12), 1.0)
    return none * costs.step_s(batch, k, context, proposer, 1.0) + \
        (1 - none) * costs.step_s(batch, k, context, proposer, some)


def break_even_tokens(costs: CostModel, batch, k: int, context=DEFAULT_CONTEXT, proposer: str = "draft"):
    """E[tokens/step] at which SD with k just pays off: t_sd / t_base."""
    return costs.step_s(batch, k, context, proposer) / costs.step_s(batch, 0, context)


def break_even_alpha(costs: CostModel, batch: int, k: int, context=DEFAULT_CONTEXT,
                     proposer: str = "draft") -> float | None:
    """i.i.d. acceptance alpha at which SD with k breaks even (None if even alpha = 1 cannot)."""
    if k < 1:
        return None
    need = float(break_even_tokens(costs, batch, k, context, proposer))
    if need <= 1:
        return 0.0
    if need >= k + 1:
        return None
    return float(brentq(lambda a: acceptance.iid_expected_tokens(a, k) - need, 0.0, 1.0 - 1e-12))


def best_break_even_alpha(costs: CostModel, batch: int, context=DEFAULT_CONTEXT, proposer: str = "draft",
                          k_max: int = K_MAX) -> tuple[float | None, int | None]:
    """Lowest break-even i.i.d. alpha over k = 1..k_max, and the k that attains it (None, None if none)."""
    best = (None, None)
    for k in range(1, k_max + 1):
        a = break_even_alpha(costs, batch, k, context, proposer)
        if a is not None and (best[0] is None or a < best[0]):
            best = (a, k)
    return best


def _k_range(acc: AcceptanceModel, k_max: int, extrapolate: bool) -> int:
    return k_max if extrapolate else min(k_max, acc.max_k)


def optimal_k(costs: CostModel, acc: AcceptanceModel, batch: int, context=DEFAULT_CONTEXT,
              proposer: str = "draft", k_max: int = K_MAX, extrapolate: bool = False) -> tuple[int, float]:
    """(best k in 0..k_max, its speedup); k = 0 (no SD) unless some k beats 1. Without `extrapolate` the
    search stops at the deepest position the traces cover."""
    ks = range(_k_range(acc, k_max, extrapolate) + 1)
    s = [float(speedup(costs, acc, batch, k, context, proposer, extrapolate)) for k in ks]
    best = int(np.argmax(s))  # first maximum: ties go to the smaller k
    return best, s[best]


def policy(costs: CostModel, acc: AcceptanceModel, max_batch: int = MAX_BATCH, context=DEFAULT_CONTEXT,
           proposer: str = "draft", k_max: int = K_MAX, extrapolate: bool = False) -> list[list[int]]:
    """Best k for every batch size 1..max_batch, merged into vLLM's [[start_bs, end_bs, k], ...] ranges."""
    b = np.arange(1, max_batch + 1)
    ks = range(_k_range(acc, k_max, extrapolate) + 1)
    table = np.vstack([np.broadcast_to(speedup(costs, acc, b, k, context, proposer, extrapolate), b.shape)
                       for k in ks])
    best = table.argmax(0)
    out: list[list[int]] = []
    for bs, k in zip(b.tolist(), best.tolist()):
        if out and out[-1][2] == k:
            out[-1][1] = bs
        else:
            out.append([bs, bs, k])
    return out


@dataclass
class Prediction:
    """A speedup prediction (x, no-SD = 1) with its `level` bootstrap interval [lo, hi]; times in seconds."""

    batch: int
    k: int
    context: float
    speedup: float
    lo: float
    hi: float
    level: float
    tokens_per_step: float
    iid_tokens_per_step: float
    step_s: float
    base_step_s: float
    cost_source: str


def speedup_with_prefill(costs: CostModel, acc, batch, k: int, context, proposer: str, prompt_tokens: float,
                         output_tokens: float, extrapolate: bool = False):
    """Speedup of a whole request including its prefill (one target forward over batch*prompt_tokens):
    (prefill + G * t_base) / (prefill + G / E[tokens/step] * t_sd), G = output_tokens - 1 decode tokens."""
    if k == 0:
        return 1.0
    pre = costs.prefill_scale * costs.forward_s("target", batch, prompt_tokens, 0)
    g = max(output_tokens - 1, 0)
    base = pre + g * costs.step_s(batch, 0, context)
    sd = pre + g / acc.expected_tokens(k, extrapolate) * sd_step_s(costs, acc, batch, k, context, proposer,
                                                                   extrapolate)
    return base / sd


def request_speedup(costs: CostModel, acc, batch: int, k: int, proposer: str, prefill: bool = True) -> float:
    """Per-request steady state, aggregated as the paper's simulator does (mean throughput with SD over mean
    throughput without): each traced request r has its own tokens per step at k (its replay), prompt P_r,
    output G_r and mean context P_r + G_r/2; L_r = prefill + (G_r - 1) / E_r * t_step. Needs a
    ReplayAcceptance (per-request lengths)."""
    if k == 0:
        return 1.0
    P, G = acc.prompt_len, acc.gen_len
    ctx = P + G / 2
    pre = costs.prefill_scale * costs.forward_s("target", batch, P, 0) if prefill else 0.0
    base = pre + (G - 1) * costs.step_s(batch, 0, ctx)
    full = costs.step_s(batch, k, ctx, proposer)
    if proposer == "ngram":
        f = acc.request_propose_fraction(k)
        step = f * full + (1 - f) * costs.step_s(batch, 0, ctx)
    else:
        step = full
    sd = pre + (G - 1) / acc.request_tokens_per_step(k) * step
    return float(np.mean(G / sd) / np.mean(G / base))


def predict(costs: CostModel, acc, batch: int, k: int, context=DEFAULT_CONTEXT,
            proposer: str = "draft", n_boot: int = 300, level: float = 0.9, seed: int = 0,
            extrapolate: bool = False, prefill: tuple[float, float] | None = None) -> Prediction:
    """Point speedup plus a percentile-bootstrap interval (traces and cost residuals resampled jointly, and the
    run-to-run noise of a measured cell where the costs carry it: CostModel.run_log_sd).
    `prefill` = (prompt tokens, output tokens) counts each request's prefill (speedup_with_prefill)."""
    def one(c, a):
        if len(getattr(a, "gen_len", [])):  # per-position traces: per-request steady state
            return request_speedup(c, a, batch, k, proposer, prefill is not None)
        if prefill is None:
            return float(speedup(c, a, batch, k, context, proposer, extrapolate))
        return float(speedup_with_prefill(c, a, batch, k, context, proposer, *prefill, extrapolate))

    point = one(costs, acc)
    rng = np.random.default_rng(seed)
    boots = [one(costs.resample(rng), acc.resample(rng)) * costs.run_noise(rng) for _ in range(n_boot if k > 0 else 0)]
    tail = (1 - level) / 2 * 100
    lo, hi = (np.percentile(boots, [tail, 100 - tail]) if boots else (point, point))
    return Prediction(batch, k, context, point, float(lo), float(hi), level,
                      acc.expected_tokens(k, extrapolate) if k else 1.0, acc.iid_expected_tokens(k) if k else 1.0,
                      float(sd_step_s(costs, acc, batch, k, context, proposer, extrapolate)) if k else float(costs.step_s(batch, 0, context)),
                      float(costs.step_s(batch, 0, context)), costs.source)


# -- inputs of advise (report/advise.py): proposers, vLLM's config, acceptance ---------------------------
PROPOSERS = proposer_names(predicted=True)


def vllm_speculative_config(pair: str, proposer: str, k: int) -> dict | None:
    """A complete --speculative-config for vLLM (method, model where needed, num_speculative_tokens >= 1),
    built by the vLLM runner's own translation; None when SD should be off (k = 0)."""
    if k < 1:
        return None
    from ..engines.vllm_runner import check_speculative_config, speculative_config

    try:
        conf = speculative_config(Study(pair, generation=Generation(ngram_match="earliest")),
                                  {"k": int(k), "proposer": proposer})
    except SpecdecError:
        return None
    return check_speculative_config(conf)


def load_acceptance(traces: str | None, profile: str, pair: str, proposer: str):
    """(acceptance model, mean prompt tokens or None, mean output tokens or None) from `traces`: a JSONL file
    of engine step traces ({"k", "accepted"}), a file of per-position traces (the paper's format or our
    converted one), or COLLECTION/DATASET under data/traces; without `traces`, this profile's raw runs."""
    from ..data import traces as tr

    if traces is None:
        found, where = acceptance.load_traces(profile, pair, "draft" if proposer == "eagle" else proposer)
        return AcceptanceModel.from_traces(found, source=where), None, None
    ts = tr.resolve(traces, proposer)
    if ts is None:
        return AcceptanceModel.from_traces(acceptance.read_jsonl(traces), source=str(traces)), None, None
    P = float(np.mean([r.prompt_len for r in ts.requests]))
    G = float(np.mean([r.generated_len for r in ts.requests]))
    return replay_acceptance(ts, K_MAX), P, G


@lru_cache(maxsize=64)
def replay_acceptance(ts, k_max: int):
    """ReplayAcceptance of a trace set (cached: replaying every request at every k takes ~0.5 s)."""
    return acceptance.ReplayAcceptance.from_trace_set(ts, k_max)


# -- static batches (validation on measured cells: report/advise.py) ------------------------------------
def static_finish(acc: AcceptanceModel, k: int, batch: int, new_tokens: int, n_sim: int = 1000, seed: int = 0,
                  extrapolate: bool = False, per_request: bool = True) -> np.ndarray:
    """Steps each sequence of `n_sim` simulated static batches takes to its `new_tokens` tokens: an (n_sim,
    batch) integer array. A step gives min(n, k) + 1 tokens.

    per_request (and traces that all ran with k or more): each simulated sequence is a random traced request
    and draws its steps from that request's own accepted counts, so requests that accept little (prose
    vs code) slow the batch down as they do in reality; otherwise steps are i.i.d. from P(n | k)."""
    if k == 0 or new_tokens <= 0:
        return np.full((n_sim, batch), max(new_tokens, 0), dtype=int)
    rng = np.random.default_rng(seed)
    traces = acc.traces if per_request and acc.traces and min(t.k for t in acc.traces) >= k else None
    if traces:
        lengths = np.array([len(t.accepted) for t in traces])
        table = np.zeros((len(traces), lengths.max()), dtype=int)
        for i, t in enumerate(traces):
            table[i, :len(t.accepted)] = t.accepted
        req = rng.integers(0, len(traces), size=(n_sim, batch, 1))
        pos = (rng.random((n_sim, batch, new_tokens)) * lengths[req]).astype(int)
        n = np.minimum(table[req, pos], k)
    else:
        n = rng.choice(k + 1, size=(n_sim, batch, new_tokens), p=acc.length_dist(k, extrapolate))
    done = np.cumsum(n + 1, axis=2) >= new_tokens
    return done.argmax(axis=2) + 1


def static_steps(acc: AcceptanceModel, k: int, batch: int, new_tokens: int, n_sim: int = 1000,
                 seed: int = 0, extrapolate: bool = False, per_request: bool = True) -> float:
    """Expected steps for a static batch: each of `batch` sequences needs `new_tokens` tokens and the batch runs
    until its slowest sequence is done (static_finish)."""
    return float(static_finish(acc, k, batch, new_tokens, n_sim, seed, extrapolate, per_request).max(axis=1).mean())


def static_seconds(finish: np.ndarray, step_s) -> float:
    """Mean decode seconds of the simulated static batches `finish` (static_finish: steps per sequence) when a
    finished sequence leaves the batch (torch.finished: retire, as vLLM's scheduler does): a step that m
    sequences still need costs step_s(m) seconds. With every sequence kept to the end this would be
    max steps x step_s(batch)."""
    ordered = np.sort(np.asarray(finish), axis=1)
    gaps = np.diff(ordered, axis=1, prepend=0)  # steps run by batch, batch - 1, ..., 1 sequences
    widths = ordered.shape[1] - np.arange(ordered.shape[1])
    cost = np.array([float(step_s(int(w))) for w in widths])
    return float((gaps * cost).sum(axis=1).mean())


