"""Engine fidelity: vLLM (the production engine the paper measures) and our torch engine on the same cells.

Both engines measure the same study cells on the same prompts. Within an engine every SD speedup is paired
(pairing.py), so it is free of the machine's drift. Across engines nothing can be interleaved (the two
never hold the pair in memory at once), so the no-SD throughput ratio torch / vLLM is given raw and divided
by each run's read-bandwidth probe (probe.py), which removes the drift that the probe sees.

The roofline at batch 1: decoding one token streams every weight but the input embedding once, so plain
decoding is bounded by probe bandwidth / target bytes (tokens/s), and an SD step (one target pass over k+1
tokens plus k draft passes, each memory-bound at batch 1) by tokens_per_step x target bytes /
(target bytes + k x draft bytes) times that; n-gram lookup reads no weights. Units: tokens/s, GB/s (1e9 B/s),
speedups dimensionless.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..data import models, tables
from ..errors import SpecdecError
from . import analysis

KEYS = ["batch", "k", "proposer", "temperature", "quant"]
ENGINES = ("vllm", "torch")


def _probe(runs: pd.DataFrame) -> pd.Series:
    """Mean of each run's before/after probe (GB/s), by run_id."""
    r = runs.set_index("run_id")
    return r[["probe_before_gbs", "probe_after_gbs"]].mean(axis=1, skipna=True)


def tokens_per_step(profile: str, study: str = "batch") -> pd.Series:
    """Tokens per sequence per step of each SD run, by run_id: 1 + mean draft tokens accepted per step
    (lengths table). vLLM counts only steps that proposed something; the torch engine counts every step."""
    try:
        lengths = tables.load(profile, study, "lengths")
    except SpecdecError:
        return pd.Series(dtype=float)
    g = lengths.assign(acc=lengths["length"] * lengths["count"]).groupby("run_id")[["acc", "count"]].sum()
    return 1 + g["acc"] / g["count"]


def _table(profile: str, study: str) -> pd.DataFrame:
    sp = analysis.speedup(profile, study, replicates=True)
    if "engine" not in sp or not set(ENGINES) <= set(sp["engine"]):
        raise SpecdecError(f"engine fidelity needs cells of both engines (vllm and torch) in {study}/{profile}; "
                           f"measured: {', '.join(sorted(set(sp.get('engine', []))))}")
    runs = tables.runs(profile, study)
    b = tables.load(profile, study, "batches")
    same = b.groupby("run_id")["same_as_base"].mean() if "same_as_base" in b else pd.Series(dtype=float)
    sp = sp.assign(probe_gbs=sp["run_id"].map(_probe(runs)),
                   tokens_per_step=sp["run_id"].map(tokens_per_step(profile, study)),
                   same_as_base=sp["run_id"].map(same))
    return sp


def engines(profile: str, study: str = "batch") -> pd.DataFrame:
    """One row per cell measured by both engines: no-SD throughput of each (tokens/s; the SD cell's own
    interleaved base arm, or the k=0 cell), base_ratio = torch / vLLM raw and base_ratio_probe divided by
    each run's probe (GB/s); each engine's SD speedup with its 95% CI; speedup_ratio = torch / vLLM speedup
    with a CI (replicates of the two engines are independent); tokens per step of each; vllm_same_as_base
    (share of vLLM's SD sequences identical to its own no-SD ones: 1 for greedy cells); verdict "agree"
    when the two speedup CIs overlap, else "disagree" (NaN speedups for k=0 rows: "no SD")."""
    sp = _table(profile, study)
    rows = []
    for key, g in sp.groupby(KEYS, dropna=False, sort=True):
        by = {e: g[g["engine"] == e] for e in ENGINES}
        if any(d.empty for d in by.values()):
            continue
        v, t = (by[e].iloc[0] for e in ENGINES)
        row = dict(zip(KEYS, key))
        for e, r in (("vllm", v), ("torch", t)):
            row.update({f"{e}_run": r["run_id"], f"{e}_base_tok_s": r["baseline_tok_s"] if r["k"] else
                        r["throughput_tok_s"], f"{e}_probe_gbs": r["probe_gbs"]})
        row["base_ratio"] = row["torch_base_tok_s"] / row["vllm_base_tok_s"]
        row["base_ratio_probe"] = row["base_ratio"] * row["vllm_probe_gbs"] / row["torch_probe_gbs"]
        if row["k"] > 0:
            for e, r in (("vllm", v), ("torch", t)):
                row.update({f"{e}_speedup": r["speedup"], f"{e}_ci_lo": r["ci_lo"], f"{e}_ci_hi": r["ci_hi"],
                            f"{e}_tokens_per_step": r["tokens_per_step"]})
            row["vllm_same_as_base"] = v["same_as_base"]
            reps = np.asarray(t["replicates"], float) / np.asarray(v["replicates"], float)
            lo, hi = analysis.ci(reps)
            overlap = max(v["ci_lo"], t["ci_lo"]) <= min(v["ci_hi"], t["ci_hi"])
            row.update(speedup_ratio=t["speedup"] / v["speedup"], ratio_ci_lo=lo, ratio_ci_hi=hi,
                       verdict="agree" if overlap else "disagree")
        else:
            row["verdict"] = "no SD"
        rows.append(row)
    if not rows:
        raise SpecdecError(f"no cell of {study}/{profile} was measured by both engines")
    return pd.DataFrame(rows)


def roofline(profile: str, study: str = "batch") -> pd.DataFrame:
    """Batch-1 cells of each engine against the read-bandwidth bound: probe_gbs, base_tok_s and
    base_bound_tok_s (tokens/s), base_frac = measured / bound; for SD cells tokens_per_step, bound_speedup
    and sd_frac = measured speedup / bound speedup. Needs the pair's read bytes (models.read_bytes)."""
    sp = _table(profile, study)
    sp = sp[sp["batch"] == 1]
    if sp.empty:
        raise SpecdecError(f"no batch-1 cells in {study}/{profile}")
    rows = []
    for _, r in sp.iterrows():
        tgt, dft = models.read_bytes(r["pair"])
        bound = r["probe_gbs"] * 1e9 / tgt
        base = r["baseline_tok_s"] if r["k"] else r["throughput_tok_s"]
        out = {"engine": r["engine"], "run_id": r["run_id"], "k": r["k"], "proposer": r["proposer"],
               "probe_gbs": r["probe_gbs"], "target_read_gb": tgt / 1e9, "draft_read_gb": dft / 1e9,
               "base_tok_s": base, "base_bound_tok_s": bound, "base_frac": base / bound}
        if r["k"]:
            read = tgt + (r["k"] * dft if r["proposer"] == "draft" else 0.0)
            bsp = r["tokens_per_step"] * tgt / read
            out.update(tokens_per_step=r["tokens_per_step"], speedup=r["speedup"], bound_speedup=bsp,
                       sd_frac=r["speedup"] / bsp)
        rows.append(out)
    return pd.DataFrame(rows)


def vllm_step_split(profile: str, study: str = "batch") -> pd.DataFrame:
    """Per vLLM SD run: where its steps' time went (vllm_steps.py), summed over the cell arm's timed calls:
    engine_steps, step_s, draft_s, verify_s, other_s (s) and draft_frac / verify_frac / other_frac of step_s.
    Calls include their prefill steps. Runs measured without the in-process timer are left out."""
    b = tables.load(profile, study, "batches")
    if "draft_s" not in b:
        raise SpecdecError(f"no vLLM step timings in {study}/{profile} (engine measured out of process, or before "
                           f"vllm_steps existed)")
    b = b[(b["engine"] == "vllm") & (b["arm"] == "cell") & (b["k"] > 0) & b["draft_s"].notna()]
    if b.empty:
        raise SpecdecError(f"no vLLM SD runs with step timings in {study}/{profile}")
    cols = ["engine_steps", "step_s", "draft_s", "verify_s", "other_s"]
    out = b.groupby(["run_id", "batch", "k", "proposer"], as_index=False)[cols].sum()
    for part in ("draft", "verify", "other"):
        out[f"{part}_frac"] = out[f"{part}_s"] / out["step_s"]
    return out.sort_values(["proposer", "batch", "k"], ignore_index=True)


def bandwidth(profile: str) -> pd.DataFrame:
    """The machine's read bandwidth as the probes of every run of the profile saw it (probe.py), per study and
    engine: n_probes, median/min/max GB/s, first/last run start. The roofline's denominator."""
    from ..data import config

    rows = []
    for study in config.study_names():
        try:
            runs = tables.runs(profile, study)
        except SpecdecError:
            continue
        if "probe_before_gbs" not in runs:
            continue
        for eng, g in runs.groupby("engine"):
            vals = pd.concat([g["probe_before_gbs"], g["probe_after_gbs"]]).dropna()
            if len(vals):
                rows.append({"study": study, "engine": eng, "n_probes": len(vals), "median_gbs": vals.median(),
                             "min_gbs": vals.min(), "max_gbs": vals.max(), "first_run": g["started"].min(),
                             "last_run": g["started"].max()})
    if not rows:
        raise SpecdecError(f"no run of profile '{profile}' recorded a bandwidth probe (runs before probe.py)")
    return pd.DataFrame(rows)


ACC_KEYS = ["batch", "k", "proposer", "temperature"]


def acceptance(profile: str, study: str = "acceptance") -> pd.DataFrame:
    """Per real-acceptance cell measured by both engines and draft position (1..k): each engine's `tried`
    (steps that reached the position: its first position-1 draft tokens accepted) and `accepted` counts summed
    over the cell's prompts and timed passes, its rate p = accepted / tried (probability), and diff = vLLM p -
    torch p. Both engines decode the same prompts, so a greedy cell should give the same tokens and the same
    counts; a difference is the two engines' arithmetic diverging, or their counting. Sampled cells
    (temperature > 0) draw different random numbers in each engine and are shown, not expected to match.

    One basis for both: vLLM counts a draft only when its proposer proposed something (num_drafts), while the
    torch engine's position 1 is tried by every step, also an n-gram step that found no match; so the torch
    engine's position-1 `tried` here is its steps that proposed a token there (`proposed`), as vLLM counts."""
    pos = analysis.position_acceptance(profile, study)
    if not set(ENGINES) <= set(pos["engine"]):
        raise SpecdecError(f"acceptance fidelity needs real-acceptance cells of both engines in {study}/{profile}; "
                           f"measured: {', '.join(sorted(set(pos['engine'])))}")
    first = (pos["engine"] == "torch") & (pos["position"] == 1) & pos["proposed"].notna()
    pos = pos.assign(tried=pos["tried"].where(~first, pos["proposed"]))
    g = pos.groupby(["engine"] + ACC_KEYS + ["position"], dropna=False)[["tried", "accepted"]].sum()
    wide = g.unstack("engine").dropna()
    if wide.empty:
        raise SpecdecError(f"no real-acceptance cell of {study}/{profile} was measured by both engines")
    out = pd.DataFrame(index=wide.index)
    for e in ENGINES:
        out[f"{e}_tried"] = wide[("tried", e)].astype(int)
        out[f"{e}_accepted"] = wide[("accepted", e)].astype(int)
        out[f"{e}_p"] = out[f"{e}_accepted"] / out[f"{e}_tried"].where(out[f"{e}_tried"] > 0)
    out["diff"] = out["vllm_p"] - out["torch_p"]
    return out.reset_index()
