"""Predicted tables: what a profile's measured tables would show, from an acceptance-trace collection
(data/traces) and the profile's cost source (costmodel.load: published coefficients, e.g. the paper's H100 fit,
else a roofline prior). Each function is named as the analysis.py function whose table it stands in for
(predicted columns, plus `basis` and `source`); views.py picks one or the other per (profile, study).

Predicted batch cells use the paper's protocol (replay.py): the four datasets of the collection, EAGLE and
n-gram proposers at k = 3 (the paper's setting), batch 1..128, prefill counted. Held-out datasets are shown
and flagged (`held_out`); nothing here is fitted to them. Units as in analysis.py: seconds, tokens/s, ratios.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from ..data import hardware
from ..data import traces as tr
from ..errors import SpecdecError
from ..model import acceptance, costmodel, predict, replay

STUDIES = ("batch", "acceptance", "hardware")  # the raw studies whose tables this module predicts
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
K_PAPER = 3
CONTEXTS = (256, 1024)

# Measured columns the predicted table of the same name does not carry (tests/test_views.py: every other
# measured column must be predicted). Most have no predicted value (run ids, paired arms, counters, CIs of
# measured quantities); some could be filled (engine, pair, quant, mode) but are not, so that the shipped
# predicted tables stay as they were: filling them is a change of the h100/a100/l4 CSVs, left for a decision.
MEASURED_ONLY = {
    "speedup": ("run_id", "trace", "decode_tokens", "decode_s", "paired_base_tok_s", "paired_speedup",
                "baseline_run", "baseline_tok_s"),
    "draft_overhead": ("run_id", "trace"),
    "position_acceptance": ("engine", "pair", "alpha", "quant", "mode", "n_requests", "accepted", "proposed"),
    "request_acceptance": ("engine", "pair", "batch", "alpha", "quant", "mode", "run_id", "repeat", "batch_idx", "rid",
                           "prompt_idx", "tried", "proposed", "accepted", "steps", "acceptance_rate",
                           "tokens_per_step"),
    "acceptance_summary": ("profile", "engine", "pair", "batch", "alpha", "quant", "mode", "alpha_ci_lo",
                           "alpha_ci_hi", "acceptance_rate", "rate_ci_lo", "rate_ci_hi", "tokens_per_step",
                           "tps_ci_lo", "tps_ci_hi"),
    "iid_prediction": ("profile", "engine", "pair", "quant", "mode", "n_requests", "alpha_ci_lo", "alpha_ci_hi",
                       "abs_error"),
    "synthetic_speedup": ("profile", "engine", "pair", "run_id", "mode", "proposer", "temperature", "quant", "rate",
                          "context", "requests", "trace", "n_units", "decode_tokens", "decode_s",
                          "tokens_per_seq_step", "throughput_tok_s", "tp_ci_lo", "tp_ci_hi", "paired_base_tok_s",
                          "paired_speedup", "baseline_run", "baseline_tok_s", "note"),
    "break_even": ("engine", "temperature", "quant", "alphas", "speedup_at_min_alpha", "speedup_at_max_alpha"),
    "forward_times": (),
    "forward_ratio": ("engine", "pair"),
}


@lru_cache(maxsize=32)
def inputs(profile: str) -> tuple[str, costmodel.CostModel]:
    """(trace collection, cost model) for predictions on `profile`: a collection recorded on this profile if any,
    else any collection (acceptance is a property of the model pair, not of the hardware); the cost source
    is costmodel.load for the collection's pair. None available is a one-line error."""
    hardware.load_profile(profile)
    names = tr.for_profile(profile) or tr.collections()
    if not names:
        raise SpecdecError("no trace collection under data/traces (run `specdec import-traces`)")
    errors = []
    for name in names:
        try:
            return name, costmodel.load(profile, tr.source(name)["pair"])
        except SpecdecError as e:
            errors.append(str(e))
    raise SpecdecError(f"nothing to predict on '{profile}': {'; '.join(errors)}")


def _sets(profile: str):
    name, costs = inputs(profile)
    return [(tr.load(name, d, p), costs) for d in tr.datasets(name) for p in tr.PROPOSERS]


def _label(ts: tr.TraceSet) -> str:
    return f"{ts.proposer}: {ts.dataset}" + (" (held out)" if ts.held_out else "")


def _base(profile: str, ts: tr.TraceSet, costs) -> dict:
    return {"profile": profile, "engine": "predicted", "pair": ts.pair, "mode": "static", "temperature": 0.0,
            "alpha": np.nan, "quant": "none", "rate": np.nan, "context": np.nan, "requests": np.nan,
            "dataset": ts.dataset, "held_out": ts.held_out, "basis": "predicted",
            "source": f"traces {ts.name}/{ts.dataset} + {costs.source} costs"}


# -- batch ----------------------------------------------------------------------------------------------------
@lru_cache(maxsize=16)
def speedup(profile: str) -> pd.DataFrame:
    """analysis.speedup's columns: trace replay under the cost source (cached: views copies it)."""
    rows = []
    for ts, costs in _sets(profile):
        for b in BATCHES:
            base_lat = replay.request_latencies(ts, costs, b, 0)
            base_tp = float(np.mean(b * base_lat["tokens"] / base_lat["org_s"]))
            for k in (0, K_PAPER):
                r = replay.speedup(ts, costs, b, k) if k else {"speedup": 1.0, "ci_lo": 1.0, "ci_hi": 1.0,
                                                              "tokens_per_step": 1.0}
                tp = base_tp * r["speedup"]
                rows.append({**_base(profile, ts, costs), "batch": b, "k": k, "proposer": _label(ts) if k else "none",
                             "n_units": len(replay.sample(ts)), "tokens_per_seq_step": r["tokens_per_step"],
                             "throughput_tok_s": tp, "tp_ci_lo": base_tp * r["ci_lo"], "tp_ci_hi": base_tp * r["ci_hi"],
                             "speedup": r["speedup"], "ci_lo": r["ci_lo"], "ci_hi": r["ci_hi"],
                             "note": "baseline" if k == 0 else "predicted (trace replay, prefill counted)",
                             "traced_proposer": ts.proposer})
    df = pd.DataFrame(rows)
    # one no-SD row per batch size (all trace sets share the cost model; keep the first as the baseline row)
    return pd.concat([df[df["k"] == 0].drop_duplicates("batch"), df[df["k"] > 0]], ignore_index=True)


def draft_overhead(profile: str) -> pd.DataFrame:
    """Share of step time spent proposing, from the cost model at k=3."""
    rows = []
    for ts, costs in _sets(profile):
        ctx = float(np.mean([r.prompt_len + r.generated_len / 2 for r in ts.requests]))
        for b in BATCHES:
            draft, verify, other = map(float, costs.step_parts(b, K_PAPER, ctx, ts.proposer))
            tot = draft + verify + other
            rows.append({**_base(profile, ts, costs), "batch": b, "k": K_PAPER, "proposer": _label(ts),
                         "n_steps": np.nan, "draft_s": draft, "verify_s": verify, "other_s": other,
                         "draft_frac": draft / tot, "ci_lo": np.nan, "ci_hi": np.nan, "verify_frac": verify / tot,
                         "context": ctx})
    return pd.DataFrame(rows)


# -- acceptance -------------------------------------------------------------------------------------------------
def _replayed(profile: str, k: int = 6):
    """(trace set, its ReplayAcceptance up to k) for every trace set of the profile's collection."""
    return [(ts, predict.replay_acceptance(ts, k)) for ts, _ in _sets(profile)]


def position_acceptance(profile: str) -> pd.DataFrame:
    """Per-position conditional acceptance: the published traces replayed at k = 6."""
    rows = []
    rng = np.random.default_rng(0)
    for ts, acc in _replayed(profile):
        k = acc.max_k
        p = acc.conditionals(k)
        boots = np.array([acc.resample(rng).conditionals(k) for _ in range(100)])
        lo, hi = np.nanpercentile(boots, [2.5, 97.5], axis=0)
        for j in range(k):
            rows.append({"profile": profile, "proposer": ts.proposer, "temperature": 0.0, "prompt_set": ts.dataset,
                         "k": k, "batch": 1, "position": j + 1, "p_accept": p[j], "ci_lo": lo[j], "ci_hi": hi[j],
                         "tried": acc.per_k[k].tried_total[j], "basis": "traced",
                         "held_out": ts.held_out})
    return pd.DataFrame(rows)


def request_acceptance(profile: str) -> pd.DataFrame:
    """Per-request acceptance at k = 3 from the replay."""
    rows = []
    for ts, acc in _replayed(profile):
        m = acc.per_k[K_PAPER]
        a = np.divide(m.acc.sum(1), m.tried.sum(1), out=np.full(len(m.tried), np.nan), where=m.tried.sum(1) > 0)
        rows += [{"profile": profile, "proposer": ts.proposer, "temperature": 0.0, "prompt_set": ts.dataset,
                  "k": K_PAPER, "alpha_measured": x, "basis": "traced"} for x in a]
    return pd.DataFrame(rows)


def acceptance_summary(profile: str) -> pd.DataFrame:
    """Mean per-request acceptance per proposer and dataset (request_acceptance's rows)."""
    req = request_acceptance(profile)
    return (req.groupby(["proposer", "temperature", "prompt_set", "k"], as_index=False)
            .agg(n_requests=("alpha_measured", "size"), alpha_measured=("alpha_measured", "mean")))


def iid_prediction(profile: str) -> pd.DataFrame:
    """Tokens per step from the traces vs the i.i.d. formula at the same pooled acceptance, k = 1..6."""
    rows = []
    for ts, acc in _replayed(profile):
        for k in range(1, acc.max_k + 1):
            m = acc.per_k[k]
            tps, pred = m.expected_tokens(k), acc.iid_expected_tokens(k)
            rows.append({"proposer": ts.proposer, "temperature": 0.0, "k": k, "batch": 1, "alpha": np.nan,
                         "prompt_set": ts.dataset, "alpha_measured": m.iid_alpha, "measured_tps": tps,
                         "measured_ci_lo": np.nan, "measured_ci_hi": np.nan, "predicted_tps": pred,
                         "error": pred / tps - 1, "error_ci_lo": np.nan, "error_ci_hi": np.nan,
                         "synthetic": False, "basis": "traced"})
    return pd.DataFrame(rows)


def _mean_context(profile: str) -> float:
    """Mean KV tokens per sequence of the collection's requests (prompt + half the output) [tokens]."""
    return float(np.mean([r.prompt_len + r.generated_len / 2 for ts, _ in _sets(profile) for r in ts.requests]))


def synthetic_speedup(profile: str) -> pd.DataFrame:
    """Speedup vs i.i.d. alpha per batch size: the cost model's step times at k = 3 with the i.i.d. tokens per
    step (1 - a^(k+1)) / (1 - a), EAGLE's draft cost, mean context of the collection."""
    _, costs = inputs(profile)
    ctx = _mean_context(profile)
    rows = []
    for b in (1, 8, 32, 128):
        for a in np.linspace(0.1, 1.0, 10):
            s = acceptance.iid_expected_tokens(a, K_PAPER) * float(costs.step_s(b, 0, ctx)) / \
                float(costs.step_s(b, K_PAPER, ctx, "eagle"))
            rows.append({"batch": b, "k": K_PAPER, "alpha": round(float(a), 2), "speedup": s, "ci_lo": np.nan,
                         "ci_hi": np.nan, "basis": "predicted"})
    return pd.DataFrame(rows)


def break_even(profile: str) -> pd.DataFrame:
    """Break-even i.i.d. alpha per batch size at k = 3 (EAGLE's draft cost, mean context of the collection)."""
    name, costs = inputs(profile)
    ctx = _mean_context(profile)
    brk = []
    for b in (1, 8, 32, 128):
        be = predict.break_even_alpha(costs, b, K_PAPER, ctx, "eagle")
        brk.append({"profile": profile, "pair": tr.source(name)["pair"], "batch": b, "k": K_PAPER, "proposer": "eagle",
                    "break_even": np.nan if be is None else be, "ci_lo": np.nan, "ci_hi": np.nan,
                    "note": "" if be is not None else "no alpha breaks even", "basis": "predicted",
                    "context": ctx})
    return pd.DataFrame(brk)


# -- hardware -------------------------------------------------------------------------------------------------
def forward_times(profile: str) -> pd.DataFrame:
    """The cost model's target forwards and draft steps (analysis.forward_times' columns)."""
    name, costs = inputs(profile)
    rows = []
    for b in BATCHES:
        for q in (1, 2, 4, 8):
            for ctx in CONTEXTS:
                t = float(costs.forward_s("target", b, q, ctx))
                rows.append({"profile": profile, "engine": "predicted", "pair": costs.pair, "model": "target", "batch": b,
                             "query": q, "context": ctx, "tokens": b * q, "n": 0, "seconds": t, "ci_lo": np.nan,
                             "ci_hi": np.nan, "tokens_per_s": b * q / t, "basis": "predicted"})
                if q > 1:  # the proposer's whole step for k = q - 1 (a published draft cost is per step)
                    d = float(costs.draft_s(b, q - 1, ctx, "eagle"))
                    rows.append({**rows[-1], "model": "draft step (k = query-1)", "seconds": d,
                                 "tokens_per_s": b * (q - 1) / d})
    return pd.DataFrame(rows)


def forward_ratio(profile: str) -> pd.DataFrame:
    """EAGLE step / target verify time at the same query (forward_times' rows)."""
    ft = forward_times(profile)
    t = ft[ft["model"] == "target"].set_index(["batch", "query", "context"])["seconds"]
    d = ft[ft["model"] != "target"].set_index(["batch", "query", "context"])["seconds"]
    both = pd.concat({"draft_s": d, "target_s": t}, axis=1).dropna().reset_index()
    both["ratio"] = both["draft_s"] / both["target_s"]
    return both.assign(profile=profile, ci_lo=np.nan, ci_hi=np.nan, basis="predicted")
