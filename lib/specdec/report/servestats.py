"""The serving study's numbers (serving.py runs): latency percentiles, throughput and goodput per arm, and the
paired SD-vs-no-SD ratios per cell.

Arms: "base" (the no-SD server) and "cell" (the cell's SD server) measured on the same prompts at the same
arrival times. Latencies in seconds: ttft_s (send -> first token), tpot_s (per output token after the
first), itl_s (between streamed chunks; a chunk may carry several tokens), e2e_s (send -> last token).
Throughput: output tokens / the windows' durations (tokens/s); at light load it is set by the arrival rate.
Goodput: requests meeting the study's SLO (`slo`: ttft_s and tpot_s) per second of window.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..data import tables
from ..data.config import load_study
from ..data.spec import Study
from ..errors import SpecdecError
from . import analysis

PCTS = (50, 90, 99)
LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
KEYS = ["profile", "engine", "pair", "run_id", "mode", "batch", "k", "proposer", "rate"]


def slo(profile: str, study: str = "serving") -> tuple[float, float]:
    """(ttft_s, tpot_s) of the study's SLO on `profile` (section `slo`)."""
    s = Study.from_dict(load_study(study, profile)).slo
    return float(s.ttft_s), float(s.tpot_s)


def _load(profile: str, study: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    r = tables.load(profile, study, "requests")
    w = tables.load(profile, study, "windows")
    r, w = r[r["mode"] == "serve"], w[w["mode"] == "serve"]
    if r.empty:
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no serve cells")
    return r, w


def meets_slo(r: pd.DataFrame, ttft: float, tpot: float) -> pd.Series:
    """Per request: completed, first token within `ttft` s and every later token within `tpot` s on average."""
    return (r["error"].fillna("") == "") & (r["ttft_s"] <= ttft) & (r["tpot_s"].fillna(0.0) <= tpot)


def latency(profile: str, study: str = "serving") -> pd.DataFrame:
    """One row per (run, arm): requests, tok_s, req_s, goodput_req_s, slo_share, p50/p90/p99 of each latency
    (ttft_s_p50, ...; seconds), mean_acceptance_length (the cell arm's tokens per target step, from vLLM's
    counters; NaN for the base arm), config ("SD off" or "<proposer> k=<k>")."""
    r, w = _load(profile, study)
    ttft, tpot = slo(profile, study)
    rows = []
    for (run_id, arm), g in r.groupby(["run_id", "arm"], sort=False):
        win = w[(w["run_id"] == run_id) & (w["arm"] == arm)]
        dur = float(win["duration_s"].sum())
        first = g.iloc[0]
        row = {k: first[k] for k in KEYS if k in g}
        row.update(arm=arm, config="SD off" if arm == "base" or first["k"] == 0 else f"{first['proposer']} k={first['k']}",
                   requests=len(g), windows=len(win), tokens=int(win["tokens"].sum()), duration_s=dur,
                   tok_s=win["tokens"].sum() / dur, req_s=len(g) / dur,
                   goodput_req_s=float(meets_slo(g, ttft, tpot).sum()) / dur,
                   slo_share=float(meets_slo(g, ttft, tpot).mean()))
        for m in LATENCIES:
            x = np.concatenate([np.asarray(v, float) for v in g[m]]) if m == "itl_s" else g[m].to_numpy(float)
            x = x[np.isfinite(x)]
            for p in PCTS:
                row[f"{m}_p{p}"] = float(np.percentile(x, p)) if len(x) else np.nan
        drafts = win["num_drafts"].sum()
        row["mean_acceptance_length"] = (1 + win["num_accepted_tokens"].sum() / drafts) if drafts else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


RATIOS = {  # metric: (what, higher_is_better)
    "tpot_p50": ("median time per output token", False),
    "e2e_p50": ("median end-to-end latency", False),
    "ttft_p50": ("median time to first token", False),
    "tok_s": ("throughput", True),
}


def _side_by_side(df: pd.DataFrame, key: list[str], cols: list[str]) -> pd.DataFrame:
    """The cell arm's and the base arm's `cols` on one row per `key` present in both (suffixes _c and _b)."""
    c, b = (df[df["arm"] == arm].set_index(key)[cols] for arm in ("cell", "base"))
    return c.add_suffix("_c").join(b.add_suffix("_b"), how="inner")


def _matched(g: pd.DataFrame) -> pd.DataFrame:
    """Cell and base rows of each (pair, rid) side by side: the same prompt sent at the same time."""
    return _side_by_side(g, ["pair_idx", "rid"], ["tpot_s", "e2e_s", "ttft_s", "new_tokens", "output_ids"])


def _median_ratio(num: np.ndarray, den: np.ndarray, *key) -> tuple[float, np.ndarray]:
    """median(num) / median(den) over matched requests, and bootstrap replicates (matched pairs resampled)."""
    est = float(np.median(num) / np.median(den))
    n = len(num)
    if n < 2:
        return est, np.full(analysis.N_BOOT, np.nan)
    idx = analysis._rng("serve", n, *key).integers(0, n, size=(analysis.N_BOOT, n))
    return est, np.median(num[idx], axis=1) / np.median(den[idx], axis=1)


@analysis._replicates
def paired(profile: str, study: str = "serving") -> pd.DataFrame:
    """One row per (SD run, metric): base and cell values, speedup (> 1: SD better; base / cell for latencies,
    cell / base for throughput), its 95% bootstrap CI (latencies: matched requests resampled; throughput:
    pairs of windows resampled), n (units), verdict ("SD pays" / "SD loses" when the CI excludes 1, else "within
    noise"), same_output (share of matched requests whose tokens are equal in both arms; greedy decoding);
    replicates=True keeps the bootstrap replicates of the speedup (column `replicates`)."""
    r, w = _load(profile, study)
    rows = []
    for run_id, g in r[r["k"] > 0].groupby("run_id", sort=False):
        if set(g["arm"]) != {"cell", "base"}:
            continue
        m = _matched(g)
        same = float(np.mean([list(a) == list(b) for a, b in zip(m["output_ids_c"], m["output_ids_b"])]))
        first = g.iloc[0]
        for metric, (what, higher) in RATIOS.items():
            if metric == "tok_s":
                both = _side_by_side(w[w["run_id"] == run_id], ["pair_idx"], ["tokens", "duration_s"])
                tc, sc = both["tokens_c"].to_numpy(float), both["duration_s_c"].to_numpy(float)
                tb, sb = both["tokens_b"].to_numpy(float), both["duration_s_b"].to_numpy(float)
                base, cell = tb.sum() / sb.sum(), tc.sum() / sc.sum()
                wts = analysis._weights(len(both), "serve-tp", profile, run_id)
                reps = (np.full(analysis.N_BOOT, np.nan) if wts is None
                        else ((wts @ tc) / (wts @ sc)) / ((wts @ tb) / (wts @ sb)))
                est, n = cell / base, len(both)
            else:
                col = metric.replace("_p50", "_s")
                ok = m[[col + "_c", col + "_b"]].dropna()
                xb, xc = ok[col + "_b"].to_numpy(float), ok[col + "_c"].to_numpy(float)
                base, cell = float(np.median(xb)), float(np.median(xc))
                est, reps = _median_ratio(xb, xc, profile, run_id, metric)
                n = len(ok)
            lo, hi = analysis.ci(reps)
            verdict = ("SD pays" if lo > 1 else "SD loses" if hi < 1 else "within noise") if np.isfinite(lo) else \
                "CI needs >= 2 units"
            rows.append({**{k: first[k] for k in KEYS if k in g}, "metric": metric, "what": what,
                         "base": base, "cell": cell, "speedup": est, "ci_lo": lo, "ci_hi": hi, "n": n,
                         "verdict": verdict, "same_output": same, "replicates": reps})
    if not rows:
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no paired SD serve cells")
    return pd.DataFrame(rows)


def stops_paying(df: pd.DataFrame, metric: str = "tpot_p50") -> pd.DataFrame:
    """Per (proposer, k, batch): the highest rate (requests/s) at which SD still pays on `metric` (CI above 1)
    and the lowest at which it loses (CI below 1); NaN where none. From paired()."""
    rows = []
    d = df[df["metric"] == metric]
    for (prop, k, bs), g in d.groupby(["proposer", "k", "batch"]):
        pays, loses = g[g["ci_lo"] > 1]["rate"], g[g["ci_hi"] < 1]["rate"]
        rows.append({"proposer": prop, "k": k, "batch": bs, "metric": metric, "rates": len(g),
                     "pays_up_to_rate": float(pays.max()) if len(pays) else np.nan,
                     "loses_from_rate": float(loses.min()) if len(loses) else np.nan,
                     "speedup_lowest_rate": float(g.sort_values("rate")["speedup"].iloc[0]),
                     "speedup_highest_rate": float(g.sort_values("rate")["speedup"].iloc[-1])})
    return pd.DataFrame(rows)
