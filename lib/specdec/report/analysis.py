"""Results with confidence intervals from the processed tables: throughput, speedup, latency, acceptance,
break-even, overheads.

Every public function takes `profile` (a hardware profile name: "cpu", "fixture", "h100", ...), reads the
study's processed tables (tables.py: one schema for both engines, the study's current config only) and
returns a pandas DataFrame with one row per cell (or per cell x group). Missing data is a one-line
`SpecdecError`. Nothing here reads data/raw or knows an engine.

Conventions
  * Cell keys: mode, batch, k, proposer, temperature, alpha, quant, rate, context, requests (see config.py);
    `alpha`, `rate`, `context`, `requests` are floats (NaN = not set).
  * 95% confidence intervals are percentile bootstraps with N_BOOT resamples and a fixed seed derived from
    SEED and the cell, so every number is reproducible. Resampling units are stated per function; a cell
    with fewer than two units gets NaN bounds (an interval cannot be estimated from one unit).
  * Bootstrap replicates are values: functions that compute an interval take `replicates=True` to return
    them in a `replicates` column (one array of N_BOOT per row), so claims and ratios across tables combine
    replicates instead of recomputing them.
  * Speedup of a cell = its decode throughput / the decode throughput of the k=0 cell (proposer "none") at
    the same batch size, quant and mode (same temperature and `requests` when there is one). Baseline cells
    have speedup exactly 1. A paired cell (pairing.py: its batches carry a "base" arm run interleaved with
    its own) takes its baseline from those base batches instead, and its interval resamples pairs, so both
    sides of every ratio were measured minutes apart at most.
  * Acceptance follows the one definition of tables.py (a position the proposer left empty is a rejection).
"""
from __future__ import annotations

import functools
import math
import zlib

import numpy as np
import pandas as pd

from ..data import config as cfgmod
from ..data import tables
from ..errors import SpecdecError

N_BOOT = 2000
SEED = 11580  # fixed; combined with a hash of the cell so results do not depend on processing order
CI = (2.5, 97.5)
CELL_KEYS = tables.CELL_KEYS
RUN_KEYS = tables.RUN_KEYS


# -- loading ---------------------------------------------------------------------------------------------
TIMED = ("batches", "steps", "requests")  # tables whose rows belong to a timed batch (repeat, batch_idx)


def load(study: str, profile: str, table: str = "requests") -> pd.DataFrame:
    """One processed table of a study on a profile (tables.load); SpecdecError when missing. Timed tables
    leave out each run's first `timing.warmup_batches` timed batches (warm_up)."""
    df = tables.load(profile, study, table)
    return warm_up(df, warmup_batches(profile, study)) if table in TIMED else df


def warmup_batches(profile: str, study: str) -> int:
    """timing.warmup_batches of the study's config on this profile (0 where the profile has no yaml)."""
    from ..data import config as cfgmod
    return cfgmod.analysis_settings(study, profile)["warmup_batches"]


def warm_up(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """Rows of all but each run's first `n` timed batches in time order (batch_idx, then repeat; both arms
    of a paired batch go together): batches that carried one-time device costs (allocator growth, kernel
    selection for new shapes), kept in data/raw and shown by the raw tables, not counted in any statistic."""
    if n <= 0 or df.empty or not {"run_id", "batch_idx", "repeat"} <= set(df):
        return df
    order = df[["run_id", "batch_idx", "repeat"]].drop_duplicates().sort_values(["run_id", "batch_idx", "repeat"])
    first = order.groupby("run_id", sort=False).head(n)
    key = pd.MultiIndex.from_frame(df[["run_id", "batch_idx", "repeat"]])
    drop = key.isin(pd.MultiIndex.from_frame(first))
    return df[~drop].reset_index(drop=True)


def runs(profile: str, study: str) -> pd.DataFrame:
    """One row per complete run (cell) of a study: profile, engine, pair, run_id and the cell keys."""
    return tables.runs(profile, study)


def profiles(study: str | None = None) -> list[str]:
    """Profiles that have at least one complete run (of `study`, if given) under data/raw."""
    return tables.profiles(study)


def safe(fn, *args, **kwargs) -> tuple[pd.DataFrame, str]:
    """(fn(*args), "") or (empty DataFrame, the one-line reason) when the data is missing."""
    try:
        return fn(*args, **kwargs), ""
    except SpecdecError as e:
        return pd.DataFrame(), str(e)


def _require(df: pd.DataFrame, cols, what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise SpecdecError(f"{what} lacks column(s) {', '.join(missing)}")


def _replicates(fn):
    """fn(..., replicates=False): drop the `replicates` column unless asked for it."""
    @functools.wraps(fn)
    def wrapper(*args, replicates: bool = False, **kwargs):
        df = fn(*args, **kwargs)
        return df if replicates else df.drop(columns=[c for c in ("replicates", "paired_replicates") if c in df])
    return wrapper


# -- bootstrap helpers -----------------------------------------------------------------------------------
def _rng(*key) -> np.random.Generator:
    return np.random.default_rng([SEED, zlib.crc32(repr(key).encode())])


def _weights(n: int, *key) -> np.ndarray | None:
    """(N_BOOT, n) multinomial resampling counts, or None when n < 2."""
    if n < 2:
        return None
    return _rng(n, *key).multinomial(n, np.full(n, 1.0 / n), size=N_BOOT).astype(float)


def _nan_reps() -> np.ndarray:
    return np.full(N_BOOT, np.nan)


def _ratio(num, den, *key) -> tuple[float, np.ndarray]:
    """sum(num) / sum(den) and its bootstrap replicates (units = array entries)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    est = num.sum() / den.sum() if den.sum() > 0 else np.nan
    w = _weights(len(num), *key)
    if w is None:
        return est, _nan_reps()
    with np.errstate(divide="ignore", invalid="ignore"):
        return est, (w @ num) / (w @ den)


MAX_UNDEFINED = 0.05  # share of resamples allowed to be undefined (e.g. 0/0) before the CI is NaN


def ci(reps: np.ndarray) -> tuple[float, float]:
    """95% percentile interval of bootstrap replicates; (NaN, NaN) when there are none, or when more than
    MAX_UNDEFINED of them are undefined (NaN), e.g. resamples without a single proposal."""
    reps = np.asarray(reps, float)
    if reps.size == 0 or np.isnan(reps).mean() > MAX_UNDEFINED:
        return np.nan, np.nan
    lo, hi = np.nanpercentile(reps, CI)
    return float(lo), float(hi)


def _cell(row) -> dict:
    return {k: row[k] for k in RUN_KEYS + CELL_KEYS if k in row}


# -- throughput and speedup (static batches) -------------------------------------------------------------
def _batches(profile: str, study: str) -> pd.DataFrame:
    b = load(study, profile, "batches")
    if b.empty or "decode_s" not in b:
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no static batches")
    _require(b, ["decode_tokens", "decode_s"], f"batches table of {study}/{profile}")
    b = b[(b["mode"] == "static") & b["decode_s"].notna()]
    if b.empty:
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no static-batching cells")
    return b


def _paired(g: pd.DataFrame, *key) -> tuple[float, float, np.ndarray]:
    """(base throughput tok/s, speedup, replicates) of a paired run: sum over pairs of cell tokens / cell s,
    divided by the same over base batches; the bootstrap resamples pairs (both arms of a pair together)."""
    both = tables.pair_sums(g)
    tc, sc = both["decode_tokens_c"].to_numpy(float), both["decode_s_c"].to_numpy(float)
    tb, sb = both["decode_tokens_b"].to_numpy(float), both["decode_s_b"].to_numpy(float)
    base_tp = tb.sum() / sb.sum()
    est = (tc.sum() / sc.sum()) / base_tp
    w = _weights(len(both), "pair", *key)
    if w is None:
        return base_tp, est, _nan_reps()
    return base_tp, est, ((w @ tc) / (w @ sc)) / ((w @ tb) / (w @ sb))


@_replicates
def throughput(profile: str, study: str = "batch") -> pd.DataFrame:
    """Decode throughput per static cell, in generated tokens per second (all sequences of the batch).

    Columns: run keys, cell keys, n_units (timed batches of the cell's own arm), decode_tokens, decode_s
    (seconds), tokens_per_seq_step (decode tokens per sequence per engine step), throughput_tok_s = sum
    decode_tokens / sum decode_s, tp_ci_lo/tp_ci_hi (95% bootstrap over batches x repeats); for paired runs
    also paired_base_tok_s (its interleaved no-SD batches), paired_speedup and paired_replicates."""
    b = _batches(profile, study)
    rows = []
    for run_id, g in b.groupby("run_id", sort=False):
        paired = "arm" in g and (g["arm"] == "base").any()
        base_tp, psp, preps = _paired(g, profile, study, run_id) if paired else (np.nan, np.nan, None)
        g = g[g["arm"] == "cell"] if "arm" in g else g
        est, r = _ratio(g["decode_tokens"], g["decode_s"], "tp", profile, study, run_id)
        lo, hi = ci(r)
        steps = g["steps"].sum() if "steps" in g else np.nan
        size = g["size"].sum() if "size" in g else np.nan
        rows.append({**_cell(g.iloc[0]), "n_units": len(g), "decode_tokens": int(g["decode_tokens"].sum()),
                     "decode_s": float(g["decode_s"].sum()), "tokens_per_seq_step":
                     float(g["decode_tokens"].sum() / (g["steps"] * g["size"]).sum()) if steps and size else np.nan,
                     "throughput_tok_s": est, "tp_ci_lo": lo, "tp_ci_hi": hi, "replicates": r,
                     "paired_base_tok_s": base_tp, "paired_speedup": psp, "paired_replicates": preps})
    df = pd.DataFrame(rows).sort_values(["quant", "batch", "k", "proposer", "alpha"], na_position="first")
    return df.reset_index(drop=True)


def _baseline_for(row, base: pd.DataFrame):
    cand = base[(base["batch"] == row["batch"]) & (base["quant"] == row["quant"]) & (base["mode"] == row["mode"])]
    if "trace" in base:  # a replayed dataset's baseline has its prompts (lengths): never another dataset's
        cand = cand[(cand["trace"] == row["trace"]) | (cand["trace"].isna() & pd.isna(row["trace"]))]
    for key in ("temperature", "requests"):  # prefer a baseline that also matches these
        if len(cand) > 1:
            same = cand[(cand[key] == row[key]) | (cand[key].isna() & pd.isna(row[key]))]
            cand = same if len(same) else cand
    return None if cand.empty else cand.iloc[0]


@_replicates
def speedup(profile: str, study: str = "batch") -> pd.DataFrame:
    """Speedup of every static cell over the no-SD baseline (k=0) at the same batch, quant and mode.

    Columns: the throughput() columns plus baseline_run, baseline_tok_s (tokens/s), speedup (ratio,
    dimensionless), ci_lo/ci_hi (95% bootstrap: pairs for paired cells, else batches of the cell and of
    the baseline resampled independently), note ("paired" for paired cells). The baseline is of the same
    engine. Baseline rows have speedup exactly 1 and CI [1, 1]."""
    tp = throughput(profile, study, replicates=True)
    base = tp[tp["k"] == 0]
    rows = []
    for _, row in tp.iterrows():
        out = row.to_dict()
        b = _baseline_for(row, base[base["engine"] == row["engine"]]) if "engine" in base else \
            _baseline_for(row, base)
        if row["paired_replicates"] is not None and not pd.isna(row["paired_speedup"]):
            r = row["paired_replicates"]
            lo, hi = ci(r)
            out.update(baseline_run=row["run_id"], baseline_tok_s=row["paired_base_tok_s"],
                       speedup=row["paired_speedup"], ci_lo=lo, ci_hi=hi,
                       note="paired" if not np.isnan(lo) else "paired; CI needs >= 2 pairs", replicates=r)
        elif b is None:
            out.update(baseline_run=None, baseline_tok_s=np.nan, speedup=np.nan, ci_lo=np.nan, ci_hi=np.nan,
                       note=f"no k=0 baseline at batch {row['batch']}, quant {row['quant']}", replicates=_nan_reps())
        elif b["run_id"] == row["run_id"]:
            out.update(baseline_run=b["run_id"], baseline_tok_s=b["throughput_tok_s"], speedup=1.0, ci_lo=1.0,
                       ci_hi=1.0, note="baseline", replicates=np.ones(N_BOOT))
        else:
            r = row["replicates"] / b["replicates"]
            lo, hi = ci(r)
            out.update(baseline_run=b["run_id"], baseline_tok_s=b["throughput_tok_s"],
                       speedup=row["throughput_tok_s"] / b["throughput_tok_s"], ci_lo=lo, ci_hi=hi,
                       note="" if not np.isnan(lo) else "CI needs >= 2 timed batches in cell and baseline",
                       replicates=r)
        rows.append(out)
    return pd.DataFrame(rows).drop(columns=["paired_replicates"])


# -- continuous batching (Poisson arrivals) --------------------------------------------------------------
def _poisson_requests(profile: str, study: str) -> pd.DataFrame:
    r = load(study, profile, "requests")
    r = r[r["mode"] == "poisson"]
    if r.empty:
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no poisson (continuous batching) cells")
    r = r.copy()
    r["latency_s"] = r["finish_s"] - r["arrival_s"]
    r["ttft_s"] = r["first_token_s"] - r["arrival_s"]
    r["queue_s"] = r["admitted_s"] - r["arrival_s"]
    return r


def latency(profile: str, study: str = "alternatives") -> pd.DataFrame:
    """Latency percentiles of each poisson (continuous batching) cell, in seconds.

    One row per cell x metric x quantile: metric "latency_s" (finish - arrival), "ttft_s" (first token -
    arrival) or "queue_s" (admission - arrival); quantile 50, 90 or 99; value_s; ci_lo/ci_hi (95%
    bootstrap over requests); n_requests."""
    r = _poisson_requests(profile, study)
    rows = []
    for run_id, g in r.groupby("run_id", sort=False):
        for metric in ("latency_s", "ttft_s", "queue_s"):
            x = g[metric].to_numpy(float)
            rng = _rng("lat", profile, study, run_id, metric)
            idx = rng.integers(0, len(x), size=(N_BOOT, len(x))) if len(x) >= 2 else None
            for q in (50, 90, 99):
                lo, hi = ci(np.percentile(x[idx], q, axis=1)) if idx is not None else (np.nan, np.nan)
                rows.append({**_cell(g.iloc[0]), "metric": metric, "quantile": q,
                             "value_s": float(np.percentile(x, q)), "ci_lo": lo, "ci_hi": hi,
                             "n_requests": len(x)})
    return pd.DataFrame(rows)


@_replicates
def serving_throughput(profile: str, study: str = "alternatives") -> pd.DataFrame:
    """Throughput of each poisson (continuous batching) cell.

    Columns: cell keys, n_requests, n_steps, new_tokens, makespan_s (last finish - first arrival, seconds,
    summed over repeats), e2e_throughput_tok_s = new_tokens / makespan_s (bounded by the arrival rate),
    busy_s (seconds spent in engine steps), mean_active (sequences per step), throughput_tok_s = decode
    tokens / busy_s (comparable with static decode throughput), tp_ci_lo/tp_ci_hi (95% bootstrap over steps)."""
    r = _poisson_requests(profile, study)
    s = load(study, profile, "steps")
    s = s[s["mode"] == "poisson"]
    rows = []
    for run_id, g in r.groupby("run_id", sort=False):
        st = s[s["run_id"] == run_id]
        makespan = sum(gg["finish_s"].max() - gg["arrival_s"].min() for _, gg in g.groupby("repeat"))
        decode_tokens = float((g["new_tokens"] - 1).sum())
        busy = (st["draft_s"] + st["verify_s"] + st["other_s"]).to_numpy(float)
        act = st["active"].map(lambda a: int(np.sum(a)))
        step_tok = st.apply(lambda x: float(np.sum((np.asarray(x["accepted"]) + 1) * np.asarray(x["active"]))),
                            axis=1).to_numpy(float) if len(st) else np.zeros(0)
        # per-step committed tokens, rescaled so that they sum to the requests' decode tokens
        step_tok = step_tok * (decode_tokens / step_tok.sum()) if step_tok.sum() > 0 else step_tok
        est, rp = _ratio(step_tok, busy, "serve", profile, study, run_id)
        lo, hi = ci(rp)
        rows.append({**_cell(g.iloc[0]), "n_requests": len(g), "n_steps": len(st),
                     "new_tokens": int(g["new_tokens"].sum()), "makespan_s": float(makespan),
                     "e2e_throughput_tok_s": float(g["new_tokens"].sum() / makespan) if makespan > 0 else np.nan,
                     "busy_s": float(busy.sum()), "mean_active": float(act.mean()) if len(act) else np.nan,
                     "throughput_tok_s": est, "tp_ci_lo": lo, "tp_ci_hi": hi, "replicates": rp})
    return pd.DataFrame(rows)


# -- acceptance (tables: lengths, positions) -------------------------------------------------------------
ACC_GROUP = ["profile", "engine", "pair", "proposer", "temperature", "k", "batch", "alpha", "quant", "mode",
             "prompt_set"]
UNIT = ["run_id", "repeat", "batch_idx", "rid"]


def _acceptance(profile: str, study: str, name: str, synthetic: bool | None) -> pd.DataFrame:
    """The lengths or positions table, real acceptance only (synthetic False), synthetic only (True) or both."""
    df = load(study, profile, name) if name in tables.names(profile, study) else pd.DataFrame()
    if len(df) and synthetic is not None:
        df = df[df["alpha"].notna() == synthetic]
    if df.empty:
        kind = {False: "real-acceptance ", True: "synthetic-acceptance ", None: ""}[synthetic]
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no {kind}speculative cells (k > 0)")
    return df


def _units(df: pd.DataFrame) -> np.ndarray:
    """An integer code per acceptance unit (a request; a whole run for aggregate counters)."""
    return df.groupby(UNIT, dropna=False, sort=False).ngroup().to_numpy()


def _unit_sums(df: pd.DataFrame, codes: np.ndarray, cols: list[str]) -> np.ndarray:
    out = np.zeros((codes.max() + 1, len(cols)))
    np.add.at(out, codes, df[cols].to_numpy(float))
    return out


@_replicates
def position_acceptance(profile: str, study: str = "acceptance", synthetic: bool | None = False) -> pd.DataFrame:
    """P(accept position i | position i tried) per proposer, temperature, k, batch and prompt set.

    One row per group x position (1..k): n_requests (acceptance units: requests, or whole runs for
    aggregate counters), tried (steps that got to position i: the first i-1 draft tokens accepted),
    accepted (steps that accepted position i too), proposed (tried steps that held a real token there; NaN
    where unknown), p_accept = accepted / tried (probability), ci_lo/ci_hi (95% bootstrap over units).
    Real acceptance only by default (synthetic=True: the i.i.d. alpha cells)."""
    pos = _acceptance(profile, study, "positions", synthetic)
    rows = []
    for keys, g in pos.groupby(ACC_GROUP, dropna=False, sort=True):
        codes = _units(g)
        kmax = int(g["position"].max())
        T, A = np.zeros((codes.max() + 1, kmax)), np.zeros((codes.max() + 1, kmax))
        np.add.at(T, (codes, g["position"].to_numpy() - 1), g["tried"].to_numpy(float))
        np.add.at(A, (codes, g["position"].to_numpy() - 1), g["accepted"].to_numpy(float))
        w = _weights(len(T), "pos", profile, study, keys)
        with np.errstate(divide="ignore", invalid="ignore"):
            reps = (w @ A) / (w @ T) if w is not None else None
        proposed = g.groupby("position")["proposed"].sum(min_count=1)
        for i in range(kmax):
            r = reps[:, i] if reps is not None else _nan_reps()
            lo, hi = ci(r)
            rows.append({**dict(zip(ACC_GROUP, keys)), "position": i + 1, "n_requests": len(T),
                         "tried": int(T[:, i].sum()), "accepted": int(A[:, i].sum()),
                         "proposed": float(proposed.get(i + 1, np.nan)),
                         "p_accept": A[:, i].sum() / T[:, i].sum() if T[:, i].sum() else np.nan,
                         "ci_lo": lo, "ci_hi": hi, "replicates": r})
    return pd.DataFrame(rows)


def request_acceptance(profile: str, study: str = "acceptance", synthetic: bool | None = False) -> pd.DataFrame:
    """Acceptance of each unit (a request; a whole run for aggregate counters, rid NaN).

    Columns: group keys (proposer, temperature, k, batch, prompt_set, ...), run_id, repeat, batch_idx, rid,
    prompt_idx, steps (steps the request took part in), tried (tried positions), proposed (real draft
    tokens), accepted (accepted draft tokens), acceptance_rate = accepted / proposed, alpha_measured =
    accepted / tried (per-token acceptance probability; the cell key `alpha` is the forced synthetic
    acceptance, NaN for real traces), tokens_per_step = (accepted + steps) / steps."""
    pos = _acceptance(profile, study, "positions", synthetic)
    keys = ACC_GROUP + UNIT + ["prompt_idx"]
    first = pos[pos["position"] == 1].groupby(keys, dropna=False, sort=True)["tried"].sum().rename("steps")
    out = pos.groupby(keys, dropna=False, sort=True)[["tried", "proposed", "accepted"]].sum(min_count=1)
    out = out.join(first).reset_index()
    with np.errstate(divide="ignore", invalid="ignore"):
        out["acceptance_rate"] = out["accepted"] / out["proposed"]
        out["alpha_measured"] = np.where(out["tried"] > 0, out["accepted"] / out["tried"], np.nan)
    out["tokens_per_step"] = (out["accepted"] + out["steps"]) / out["steps"]
    return out


def acceptance_summary(profile: str, study: str = "acceptance", synthetic: bool | None = False) -> pd.DataFrame:
    """Acceptance per proposer, temperature, k, batch and prompt set, with 95% bootstrap CIs over units.

    Columns: group keys, n_requests, alpha_measured (pooled P(accept | tried), probability) with
    alpha_ci_lo/hi, acceptance_rate (accepted / proposed tokens) with rate_ci_lo/hi, tokens_per_step (mean
    tokens a sequence gains per step) with tps_ci_lo/hi."""
    req = request_acceptance(profile, study, synthetic)
    rows = []
    for keys, g in req.groupby(ACC_GROUP, dropna=False, sort=True):
        out = dict(zip(ACC_GROUP, keys))
        out["n_requests"] = len(g)
        for name, num, den in (("alpha", "accepted", "tried"), ("rate", "accepted", "proposed"),
                               ("tps", None, "steps")):
            numv = g["accepted"] + g["steps"] if num is None else g[num]
            est, r = _ratio(numv, g[den], "accsum", profile, study, keys, name)
            col = {"alpha": "alpha_measured", "rate": "acceptance_rate", "tps": "tokens_per_step"}[name]
            out[col] = est
            out[f"{name}_ci_lo"], out[f"{name}_ci_hi"] = ci(r)
        rows.append(out)
    return pd.DataFrame(rows)


def iid_tokens_per_step(alpha, k):
    """Expected tokens per step under i.i.d. acceptance alpha with k proposals: (1 - a^(k+1)) / (1 - a)."""
    a, k = np.asarray(alpha, float), np.asarray(k, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isclose(a, 1.0), k + 1, (1 - a ** (k + 1)) / (1 - a))


def iid_prediction(profile: str, study: str = "acceptance") -> pd.DataFrame:
    """Measured tokens/step vs the i.i.d. prediction at the same mean acceptance, per cell x prompt set.

    alpha = pooled P(accept position i | tried i) (for i.i.d. acceptance this is the per-token rate);
    measured_tps = mean (accepted + 1) over steps; predicted_tps = (1 - alpha^(k+1)) / (1 - alpha) at the
    cell's k (a position the proposer left empty is a rejection, tables.py); error = measured / predicted - 1
    (relative), abs_error = measured - predicted (tokens); CIs are 95% bootstraps over acceptance units.
    `synthetic` marks the controlled i.i.d. cells (a sanity check)."""
    pos = _acceptance(profile, study, "positions", None)
    lens = _acceptance(profile, study, "lengths", None)
    lens = lens.assign(tokens=(lens["length"] + 1) * lens["count"])
    rows = []
    both = pd.concat([pos.assign(tokens=0.0, count=0.0), lens.assign(tried=0.0, accepted=0.0)], ignore_index=True)
    for keys, g in both.groupby(ACC_GROUP, dropna=False, sort=True):
        k = int(keys[ACC_GROUP.index("k")])
        codes = _units(g)
        M = _unit_sums(g, codes, ["tried", "accepted", "tokens", "count"])

        def stats(tot):
            with np.errstate(divide="ignore", invalid="ignore"):
                a = tot[..., 1] / tot[..., 0]
                return a, tot[..., 2] / tot[..., 3], iid_tokens_per_step(a, k)

        a, meas, pred = stats(M.sum(0))
        w = _weights(len(M), "iid", profile, study, keys)
        if w is not None:
            ra, rm, rp = stats(w @ M)
            err_ci, meas_ci, a_ci = ci(rm / rp - 1), ci(rm), ci(ra)
        else:
            err_ci = meas_ci = a_ci = (np.nan, np.nan)
        rows.append({**dict(zip(ACC_GROUP, keys)), "synthetic": not np.isnan(keys[ACC_GROUP.index("alpha")]),
                     "n_requests": len(M), "alpha_measured": float(a), "alpha_ci_lo": a_ci[0],
                     "alpha_ci_hi": a_ci[1], "measured_tps": float(meas), "measured_ci_lo": meas_ci[0],
                     "measured_ci_hi": meas_ci[1], "predicted_tps": float(pred), "abs_error": float(meas - pred),
                     "error": float(meas / pred - 1), "error_ci_lo": err_ci[0], "error_ci_hi": err_ci[1]})
    return pd.DataFrame(rows)


# -- break-even acceptance ---------------------------------------------------------------------------------
def _crossing(alphas: np.ndarray, s: np.ndarray) -> float:
    """Alpha at which speedup s(alpha) reaches 1 (linear interpolation, last upward crossing).

    -inf: speedup >= 1 at every measured alpha; +inf: speedup < 1 at the largest measured alpha; NaN: NaN."""
    if np.isnan(s).any():
        return np.nan
    below = s < 1.0
    if not below.any():
        return -np.inf
    if below[-1]:
        return np.inf
    i = int(np.nonzero(below)[0][-1])
    a0, a1, s0, s1 = alphas[i], alphas[i + 1], s[i], s[i + 1]
    return float(a0 + (1.0 - s0) * (a1 - a0) / (s1 - s0))


def synthetic_speedup(profile: str, study: str = "acceptance") -> pd.DataFrame:
    """speedup() rows of the synthetic-acceptance cells (alpha set): speedup vs forced acceptance alpha."""
    sp = speedup(profile, study)
    sp = sp[sp["alpha"].notna() & (sp["k"] > 0)]
    if sp.empty:
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no synthetic-acceptance (alpha) cells")
    return sp.reset_index(drop=True)


@_replicates
def break_even(profile: str, study: str = "acceptance") -> pd.DataFrame:
    """Break-even acceptance per batch size (and k): the alpha at which SD speedup reaches 1.0.

    From the synthetic-acceptance cells (i.i.d. acceptance forced at alpha, real draft + verify cost):
    speedup vs alpha is interpolated linearly to 1.0 (last upward crossing). Columns: batch, k, proposer,
    temperature, quant, alphas (measured grid), speedup_at_min_alpha, speedup_at_max_alpha, break_even
    (probability in [0, 1], NaN when the curve does not cross 1 inside the grid: see note), ci_lo/ci_hi
    (95% bootstrap of the whole curve; NaN when open-ended), note."""
    sp = speedup(profile, study, replicates=True)
    sp = sp[sp["alpha"].notna() & (sp["k"] > 0)]
    if sp.empty:
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no synthetic-acceptance (alpha) cells")
    keys = ["profile", "engine", "pair", "batch", "k", "proposer", "temperature", "quant"]
    rows = []
    for key, g in sp.groupby(keys, dropna=False, sort=True):
        g = g.sort_values("alpha")
        alphas = g["alpha"].to_numpy(float)
        est = _crossing(alphas, g["speedup"].to_numpy(float))
        R = np.stack(list(g["replicates"]), axis=1)
        rb = np.array([_crossing(alphas, row) for row in R])
        lo = hi = np.nan
        if not np.isnan(rb).any():
            lo, hi = (float(v) for v in np.percentile(rb, CI, method="inverted_cdf"))
        note = ""
        if est == -np.inf:
            note = f"speedup >= 1 at every measured alpha: break-even below {alphas.min():g}"
        elif est == np.inf:
            note = f"speedup < 1 even at alpha {alphas.max():g}: SD never breaks even here"
        elif np.isnan(est):
            note = "missing baseline"
        elif np.isnan(lo) and np.isnan(hi):
            note = "CI needs >= 2 timed batches per cell"
        elif not (np.isfinite(lo) and np.isfinite(hi)):
            note = "CI open-ended (some resamples never cross 1)"
        rows.append({**dict(zip(keys, key)), "alphas": ",".join(f"{a:g}" for a in alphas),
                     "speedup_at_min_alpha": float(g["speedup"].iloc[0]),
                     "speedup_at_max_alpha": float(g["speedup"].iloc[-1]),
                     "break_even": est if np.isfinite(est) else np.nan,
                     "ci_lo": lo if np.isfinite(lo) else np.nan, "ci_hi": hi if np.isfinite(hi) else np.nan,
                     "note": note, "replicates": rb})
    return pd.DataFrame(rows)




# -- draft overhead ----------------------------------------------------------------------------------------
@_replicates
def draft_overhead(profile: str, study: str = "batch") -> pd.DataFrame:
    """Share of step time spent proposing, per speculative static cell, from the steps table.

    Columns: cell keys, n_steps, draft_s/verify_s/other_s (seconds, summed), draft_frac = draft_s /
    (draft_s + verify_s + other_s) (fraction) with ci_lo/ci_hi (95% bootstrap over steps), verify_frac."""
    s = load(study, profile, "steps")
    s = s[(s["k"] > 0) & (s["mode"] == "static")]
    if s.empty:
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no speculative static cells with step traces")
    rows = []
    for run_id, g in s.groupby("run_id", sort=False):
        tot = g["draft_s"] + g["verify_s"] + g["other_s"]
        est, r = _ratio(g["draft_s"], tot, "ovh", profile, study, run_id)
        lo, hi = ci(r)
        rows.append({**_cell(g.iloc[0]), "n_steps": len(g), "draft_s": float(g["draft_s"].sum()),
                     "verify_s": float(g["verify_s"].sum()), "other_s": float(g["other_s"].sum()),
                     "draft_frac": est, "ci_lo": lo, "ci_hi": hi,
                     "verify_frac": float(g["verify_s"].sum() / tot.sum()), "replicates": r})
    df = pd.DataFrame(rows).sort_values(["quant", "proposer", "batch", "k", "alpha"], na_position="first")
    return df.reset_index(drop=True)




def forward_times(profile: str, study: str = "hardware") -> pd.DataFrame:
    """Mean forward-pass time per model, batch, query and context (hardware study).

    Columns: profile, model (target | draft), batch, query (tokens per sequence), context (KV tokens),
    tokens (batch x query), n (timed repeats), seconds (mean, s) with ci_lo/ci_hi (95% bootstrap over
    repeats), tokens_per_s."""
    f = load(study, profile, "forwards")
    rows = []
    for key, g in f.groupby(["profile", "engine", "pair", "model", "batch", "query", "context"], sort=True):
        x = g["seconds"].to_numpy(float)
        est, r = _ratio(x, np.ones_like(x), "fwd", profile, study, key)
        lo, hi = ci(r)
        rows.append({**dict(zip(["profile", "engine", "pair", "model", "batch", "query", "context"], key)),
                     "tokens": int(g["tokens"].iloc[0]), "n": len(x), "seconds": est, "ci_lo": lo, "ci_hi": hi,
                     "tokens_per_s": g["tokens"].iloc[0] / est})
    return pd.DataFrame(rows)


@_replicates
def forward_ratio(profile: str, study: str = "hardware") -> pd.DataFrame:
    """Draft forward time / target forward time at the same batch, query and context (hardware study).

    Columns: profile, batch, query (tokens per sequence), context (KV tokens), draft_s, target_s (mean
    seconds), ratio (dimensionless) with ci_lo/ci_hi (95% bootstrap over repeats, models independent)."""
    f = load(study, profile, "forwards")
    keys = ["profile", "engine", "pair", "batch", "query", "context"]
    rows = []
    for key, g in f.groupby(keys, sort=True):
        d = g.loc[g["model"] == "draft", "seconds"].to_numpy(float)
        t = g.loc[g["model"] == "target", "seconds"].to_numpy(float)
        if not len(d) or not len(t):
            continue
        _, rd = _ratio(d, np.ones_like(d), "fr-d", profile, study, key)
        _, rt = _ratio(t, np.ones_like(t), "fr-t", profile, study, key)
        r = rd / rt
        lo, hi = ci(r)
        rows.append({**dict(zip(keys, key)), "draft_s": d.mean(), "target_s": t.mean(), "ratio": d.mean() / t.mean(),
                     "ci_lo": lo, "ci_hi": hi, "replicates": r})
    if not rows:
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no forward passes of both target and draft")
    return pd.DataFrame(rows)


def overhead_across_profiles(profile_list: list[str] | None = None) -> pd.DataFrame:
    """Draft overhead of every profile with data, in one tidy table (for cross-hardware comparisons).

    Rows from draft_overhead (metric "step_draft_frac", batch study, key batch/k/proposer) and forward_ratio
    (metric "forward_ratio", hardware study, key batch/query/context). Columns: profile, metric, batch, k,
    proposer, query, context, value, ci_lo, ci_hi. Profiles without either study are skipped; none at all
    is a SpecdecError."""
    names = profile_list if profile_list is not None else sorted(set(profiles("batch")) | set(profiles("hardware")))
    frames = []
    for p in names:
        ov, _ = safe(draft_overhead, p)
        if len(ov):
            frames.append(ov.assign(metric="step_draft_frac", value=ov["draft_frac"])[
                ["profile", "metric", "batch", "k", "proposer", "value", "ci_lo", "ci_hi"]])
        fr, _ = safe(forward_ratio, p)
        if len(fr):
            frames.append(fr.assign(metric="forward_ratio", value=fr["ratio"])[
                ["profile", "metric", "batch", "query", "context", "value", "ci_lo", "ci_hi"]])
    if not frames:
        raise SpecdecError(f"no draft-overhead data (batch steps or hardware forwards) for profiles "
                           f"{', '.join(names) or '(none)'}")
    return pd.concat(frames, ignore_index=True)


# -- alternatives -----------------------------------------------------------------------------------------
@_replicates
def alternatives(profile: str, study: str = "alternatives") -> pd.DataFrame:
    """Each alternative's decode-throughput speedup over a plain fp32, no-SD reference.

    Options (rows): "int8" (int8 weights, no SD), "SD" (fp32 + SD), "SD+int8" -- each vs fp32 no-SD static
    at the same batch; "static batching" (fp32 no-SD static at batch b), "continuous batching" and
    "continuous batching+SD" (Poisson arrivals, busy-time decode throughput) -- each vs fp32 no-SD static at
    the smallest batch (serving one request at a time); "continuous vs static batching" (no SD) -- vs fp32
    no-SD static batches of the poisson cell's maximum batch size (same concurrency cap). Columns: option, batch, k, proposer, quant, mode,
    rate (arrivals/s), reference, throughput_tok_s and ref_tok_s (tokens/s), speedup with ci_lo/ci_hi
    (95% bootstrap), mean_active (continuous batching: sequences per step)."""
    tp = throughput(profile, study, replicates=True)
    fp = tp[(tp["quant"] == "none") & (tp["k"] == 0)]
    rows = []

    def add(option, cell, ref, ref_name, extra=None):
        r = cell["replicates"] / ref["replicates"]
        lo, hi = ci(r)
        rows.append({"profile": profile, "option": option, "batch": int(cell["batch"]), "k": int(cell["k"]),
                     "proposer": cell["proposer"], "quant": cell["quant"], "mode": cell["mode"],
                     "rate": cell.get("rate", np.nan), "reference": ref_name, "run_id": cell["run_id"],
                     "throughput_tok_s": cell["throughput_tok_s"], "ref_tok_s": ref["throughput_tok_s"],
                     "speedup": cell["throughput_tok_s"] / ref["throughput_tok_s"], "ci_lo": lo, "ci_hi": hi,
                     **(extra or {}), "replicates": r})

    for _, ref in fp.iterrows():
        same = tp[(tp["batch"] == ref["batch"]) & (tp["mode"] == "static")]
        name = f"fp32 no-SD static bs{ref['batch']}"
        for _, c in same.iterrows():
            if c["run_id"] == ref["run_id"]:
                continue
            if c["k"] == 0 and c["quant"] != "none":
                add(f"{c['quant']}", c, ref, name)
            elif c["k"] > 0 and c["quant"] == "none":
                add("SD", c, ref, name)
            elif c["k"] > 0:
                add(f"SD+{c['quant']}", c, ref, name)
    # continuous batching: compared with serving one request at a time (static bs 1, fp32, no SD)
    try:
        serv = serving_throughput(profile, study, replicates=True)
    except SpecdecError:
        serv = None
    single = fp[fp["batch"] == fp["batch"].min()] if len(fp) else fp
    if serv is not None and len(single):
        ref = single.iloc[0]
        name = f"fp32 no-SD static bs{ref['batch']}"
        for _, c in fp[fp["batch"] > ref["batch"]].iterrows():
            add("static batching", c, ref, name)
        for _, c in serv.iterrows():
            opt = "continuous batching" if c["k"] == 0 else "continuous batching+SD"
            add(opt, c, ref, name, extra={"mean_active": c["mean_active"]})
            same = fp[fp["batch"] == c["batch"]]
            if c["k"] == 0 and len(same):  # the same concurrency cap, served in static batches
                add("continuous vs static batching", c, same.iloc[0], f"fp32 no-SD static bs{c['batch']}",
                    extra={"mean_active": c["mean_active"]})
    if not rows:
        raise SpecdecError(f"study '{study}' on profile '{profile}' has no alternative to compare with its baseline")
    return pd.DataFrame(rows)




def summary(profile: str, study: str) -> dict:
    """A few headline counts: cells (complete runs), engines, pair."""
    r = runs(profile, study)
    return {"cells": len(r), "engines": sorted(r["engine"].unique()), "pair": sorted(r["pair"].dropna().unique())}


def fmt_ci(est: float, lo: float, hi: float, digits: int = 2, unit: str = "") -> str:
    """'1.23x (95% CI 1.10-1.40)' style text; NaN bounds are shown as 'CI n/a'."""
    if est is None or (isinstance(est, float) and math.isnan(est)):
        return "n/a"
    s = f"{est:.{digits}f}{unit}"
    if lo is None or hi is None or np.isnan(lo) or np.isnan(hi):
        return f"{s} (CI n/a)"
    return f"{s} (95% CI {lo:.{digits}f}-{hi:.{digits}f})"


# -- bench study: is our engine a fair baseline? -------------------------------------------------------------
BENCH_GOALS = {0: 1.0, "sd": 1.0}  # HF time / our time: >= 1.0 vs HF generate and vs HF assisted generation


def bench(profile: str) -> pd.DataFrame:
    """Ours vs transformers per bench cell (batch, k): hf_over_ours = HF seconds / our seconds for the same
    prompts (> 1: ours is faster; dimensionless) with a 95% bootstrap CI over (repeat, batch) pairs, the goal,
    whether the point estimate meets it, and the share of sequences whose greedy outputs agree."""
    df = load("bench", profile, "bench")
    rows = []
    for (bs, k), g in df.groupby(["batch", "k"]):
        wide = g.pivot_table(index=["repeat", "batch_idx"], columns="impl", values="seconds")
        est, reps = _ratio(wide["hf"].values, wide["ours"].values, profile, "bench", bs, k)
        lo, hi = ci(reps)
        goal = BENCH_GOALS[0] if k == 0 else BENCH_GOALS["sd"]
        rows.append({"batch": int(bs), "k": int(k), "compared_with": "HF generate" if k == 0 else
                     "HF assisted generation", "pairs": len(wide), "hf_over_ours": est, "ci_lo": lo, "ci_hi": hi,
                     "goal": goal, "meets_goal": bool(est >= goal),
                     "same_output": float(g["same_output"].mean()) if "same_output" in g else np.nan})
    return pd.DataFrame(rows).sort_values(["k", "batch"], ignore_index=True)


def profile_status() -> pd.DataFrame:
    """Every hardware profile in configs/hardware with its spec-sheet numbers (peak_tflops in dense bf16
    TFLOP/s, mem_bw_tbs in TB/s) and, per study, 'measured' (complete runs under data/raw) or 'ABSENT'."""
    from ..data import hardware

    studies = [s for s in ("batch", "acceptance", "hardware", "alternatives", "serving", "bench")
               if s in cfgmod.study_names()]
    rows = []
    for name in hardware.profile_names():
        hw = hardware.load_profile(name)
        row = {"profile": name, "kind": hw.get("kind"), "description": hw.get("description"),
               "peak_tflops": hw.get("peak_tflops"), "mem_bw_tbs": hw.get("mem_bw_tbs")}
        for study in studies:
            row[study] = "measured" if tables.has_runs(name, study) else "ABSENT"
        rows.append(row)
    return pd.DataFrame(rows)


CONTENTION_RATIO = 0.8  # a batch is suspect when its cpu_util is below this share of its batch size's median


def contention(profile: str, study: str = "batch") -> pd.DataFrame:
    """Per run: min and median cpu_util (process CPU seconds / wall seconds, ~torch threads when the machine is
    quiet) over its timed batches, and `suspect` when some batch got less than CONTENTION_RATIO of the median
    cpu_util of all batches of that batch size (another process competed for the CPU), or when its
    read-bandwidth probe (probe.py, GB/s) drifted by more than probe.DRIFT between before and after the run
    or lay below probe.LOW of the profile's median probe (`drift`, `low_probe`). Runs recorded before
    cpu_util or the probe existed show NaN there and are not flagged by it."""
    from ..engines import probe

    b = load(study, profile, "batches")
    if "cpu_util" not in b:
        b["cpu_util"] = np.nan
    med = b.groupby("batch")["cpu_util"].transform("median")
    b["low"] = b["cpu_util"] < CONTENTION_RATIO * med
    out = b.groupby(["run_id", "engine", "batch", "k", "proposer"], as_index=False).agg(
        cpu_util_min=("cpu_util", "min"), cpu_util_median=("cpu_util", "median"), suspect=("low", "any"))
    runs = tables.runs(profile, study).set_index("run_id")
    for col in ("probe_before_gbs", "probe_after_gbs"):
        out[col] = out["run_id"].map(runs[col]) if col in runs else np.nan
    out["probe_drift"] = out["probe_after_gbs"] / out["probe_before_gbs"] - 1
    both = out[["probe_before_gbs", "probe_after_gbs"]]
    out["drift"] = out["probe_drift"].abs() > probe.DRIFT
    out["low_probe"] = both.min(axis=1) < probe.LOW * np.nanmedian(both.to_numpy(float)) \
        if both.notna().any().any() else False
    out["suspect"] = out["suspect"] | out["drift"] | out["low_probe"]
    return out.sort_values(["batch", "k", "proposer", "engine"], ignore_index=True)
