"""The project's stated goals, each computed from data and checked: a benchmark record, not a timed test.

Every row: goal id, what it asks (target), the value we get, whether it is met, and where the number comes
from. Goals whose inputs are missing are reported as "not evaluated" with the reason, never as met.
Written by notebooks/goals.ipynb to build/<profile>/goals.csv and goals.md (`make goals`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import SpecdecError
from . import advise
from . import analysis, views

REGIME = "cpu-bf16"  # the CPU regime where SD can pay (bf16 target on AMX + int8 draft)
GPU_PROFILES = ("a100", "h100", "h200", "l4")


def _row(gid, goal, target, value, met, source, detail=""):
    return {"goal": gid, "statement": goal, "target": target, "value": value,
            "met": ("yes" if met else "no") if met is not None else "not evaluated", "source": source,
            "detail": detail}


def _try(gid, goal, target, fn):
    try:
        return fn()
    except SpecdecError as e:
        return [_row(gid, goal, target, "n/a", None, "", str(e))]


def paper_reference() -> list[dict]:
    """G1-G2: our predictions vs the paper's simulator on the held-out datasets (H100, published fit)."""
    def run():
        val = views.validate_against_reference("h100", held_out=True)
        k3 = val[val["k"] == 3]
        kc = views.k_choice("h100", held_out=True)
        worst = kc.loc[kc["regret"].idxmax()]
        src = "data/traces/llama3.1-8b-h100 (gsm8k, instructcoder held out) + configs/hardware/h100.yaml costs"
        return [
            _row("G1a", "advise's model vs the paper's simulator, held-out datasets, bs 1-128, k=3", "MAPE <= 3%",
                 f"{k3['abs_pct_err'].mean():.2f}% over {len(k3)} cells", k3["abs_pct_err"].mean() <= 3, src,
                 f"worst {k3['abs_pct_err'].max():.1f}% ({k3.loc[k3['abs_pct_err'].idxmax(), 'dataset']}, "
                 f"bs{k3.loc[k3['abs_pct_err'].idxmax(), 'batch']}, {k3.loc[k3['abs_pct_err'].idxmax(), 'proposer']})"),
            _row("G1b", "trace replay vs the paper's simulator, held-out datasets, bs 1-128, k=3", "MAPE <= 3%",
                 f"{k3['abs_pct_err_replay'].mean():.2f}% over {len(k3)} cells", k3["abs_pct_err_replay"].mean() <= 3,
                 src, f"worst {k3['abs_pct_err_replay'].max():.1f}%"),
            _row("G2", "advise's recommended k vs the best k of the replay, held-out datasets, bs 1-128",
                 "speedup within 2% of the best k's (every cell)", f"max shortfall {worst['regret']:.2%}",
                 bool(kc["regret"].max() <= 0.02), src,
                 f"{int((kc['regret'] <= 0.02).sum())}/{len(kc)} cells within 2%; worst {worst['dataset']} "
                 f"{worst['proposer']} bs{worst['batch']}: k={worst['recommended_k']} vs best k={worst['best_k']}"),
        ]
    return _try("G1", "predictions vs the paper's simulator", "MAPE <= 3%", run)


def _g14_detail(val) -> str:
    """What G14's interval holds and which cells it misses."""
    if "covered" not in val:
        return ""
    sd = val.attrs.get("run_log_sd", 0.0)
    noise = (f"run-to-run noise {sd:.1%} (log sd, pooled over the paired calibration cells' pairs); without it "
             f"{val.attrs.get('coverage_model', float('nan')):.0%} covered" if sd > 0 else
             "no run-to-run noise term (no paired calibration cells)")
    missed = val.loc[~val["covered"].astype(bool), "run_id"].str.rsplit("-", n=1).str[0]
    return f"{noise}; uncovered: {', '.join(missed) or 'none'}"


def cpu_validation() -> list[dict]:
    """G3: predicted vs measured speedup on our own held-out CPU cells, per CPU profile."""
    rows = []
    for prof, engine in ((REGIME, "torch"), ("cpu", "torch"), ("cpu", "vllm")):
        def run(prof=prof, engine=engine):
            val = advise.validate(prof, engine=engine, n_boot=100)
            n = int(val["predicted"].notna().sum())
            cov = val.attrs.get("coverage", float("nan"))
            return [_row(f"G3 {prof} {engine}", f"predicted vs measured speedup, held-out batch-study cells "
                                                f"({prof}, {engine} engine)", "MAPE < 10%",
                         f"{val.attrs['mape']:.1f}% over {n} cells", val.attrs["mape"] < 10, f"data/raw/{prof}",
                         val.attrs["cost_source"]),
                    _row(f"G14 {prof} {engine}", f"advise's 90% interval (costs, acceptance and a cell's run-to-run "
                                                 f"noise resampled) covers the measured speedup, held-out cells "
                                                 f"({prof}, {engine} engine)",
                         ">= 90% of cells", f"{cov:.0%} of {n} cells (median half width "
                                            f"{val.attrs.get('half_width', float('nan')):.0%})", bool(cov >= 0.9),
                         f"data/raw/{prof}", _g14_detail(val))]
        rows += _try(f"G3 {prof} {engine}", f"predicted vs measured speedup ({prof}, {engine} engine)",
                     "MAPE < 10%", run)
    return rows


def regime() -> list[dict]:
    """G4-G7: the CPU regime's design targets, from its raw runs."""
    def run():
        sp = analysis.speedup(REGIME, "batch")
        ov = analysis.draft_overhead(REGIME, "batch")
        reqs = analysis.load("batch", REGIME, "requests")
        src = f"data/raw/{REGIME}/batch"
        d = ov[(ov["proposer"] == "draft") & (ov["batch"] == 1) & (ov["k"] == 3)]
        share = float(d["draft_frac"].iloc[0]) if len(d) else np.nan
        cells = set(zip(sp["batch"], sp["k"], sp["proposer"]))
        want = {(b, k, "draft") for b in (1, 4, 16) for k in range(1, 7)} | \
            {(b, 3, "draft") for b in (1, 2, 4, 8, 16, 32, 64)} | {(b, 0, "none") for b in (1, 2, 4, 8, 16, 32, 64)}
        missing = sorted(want - cells)
        sd = sp[sp["k"] > 0]
        best1 = sd[sd["batch"] == 1]["speedup"].max() if len(sd) else np.nan
        return [
            _row("G4", "draft share of SD step time (bs1, k=3, draft model)", "<= 15%", f"{share:.1%}",
                 bool(share <= 0.15), src, "measured draft_s / (draft_s + verify_s + other_s)"),
            _row("G5", "new tokens per request", ">= 64", f"min {int(reqs['new_tokens'].min())}",
                 bool(reqs["new_tokens"].min() >= 64), src),
            _row("G6", "grid: k 1-6 at bs 1, 4, 16; k=3 (and k=0) at bs 1-64", "every cell measured",
                 f"{len(want) - len(missing)}/{len(want)} cells", not missing, src,
                 "missing: " + ", ".join(f"bs{b} k{k}" for b, k, _ in missing) if missing else ""),
            _row("G7", "timed batches per cell, and a CI on every speedup", ">= 5 each; no NaN CI",
                 f"min {int(sp['n_units'].min())}; {int(sd['ci_lo'].isna().sum())} SD cells without CI",
                 bool(sp["n_units"].min() >= 5 and sd["ci_lo"].notna().all()), src),
            _row("G8", "SD pays at batch 1 in this regime (best SD cell)", "speedup > 1 with CI above 1",
                 f"{best1:.2f}x", bool(len(sd) and (sd[sd["batch"] == 1]["ci_lo"] > 1).any()), src),
        ]
    return _try("G4", "CPU regime", "", run)


def ngram_acceptance() -> list[dict]:
    """G9: the input-grounded prompt set gives the n-gram lookup realistic acceptance (an observation)."""
    def run():
        summ = analysis.acceptance_summary(REGIME, "acceptance")
        ng = summ[summ["proposer"] == "ngram"].set_index("prompt_set")["alpha_measured"]
        txt = ", ".join(f"{k}: {v:.2f}" for k, v in ng.items())
        code, rest = ng.get("codeedit", np.nan), ng.drop("codeedit", errors="ignore")
        return [_row("G9", "n-gram acceptance on the input-grounded codeedit prompts vs the other sets",
                     "codeedit higher than every other set", txt,
                     bool(len(rest) and code > rest.max()), f"data/raw/{REGIME}/acceptance")]
    return _try("G9", "n-gram acceptance", "", run)


def profiles(check) -> list[dict]:
    """G10: every GPU profile has figures to show (measured or predicted); `check(profile)` is studies.check
    (one line per study, a SpecdecError where nothing can be shown)."""
    ok, detail = [], []
    for p in GPU_PROFILES:
        try:
            lines = check(p)
            ok.append(True)
            detail.append(f"{p}: " + ("measured" if any("MEASURED" in x for x in lines) else "predicted"))
        except SpecdecError as e:
            ok.append(False)
            detail.append(f"{p}: {e}")
    return [_row("G10", "every GPU= profile has something to show", "all of " + ", ".join(GPU_PROFILES),
                 f"{sum(ok)}/{len(ok)}", all(ok), "studies.check", "; ".join(detail))]


def bench() -> list[dict]:
    """G11: is our engine a fair baseline (the bench study's own goals, profile cpu)."""
    def run():
        bn = analysis.bench("cpu")
        return [_row(f"G11 bs{r.batch} k{r.k}", "HF time / our time" + (" (assisted generation)" if r.k else
                     " (generate)"), f">= {r.goal:g}", f"{r.hf_over_ours:.2f}", bool(r.hf_over_ours >= r.goal),
                     "data/raw/cpu/bench") for r in bn.itertuples()]
    return _try("G11", "bench", "", run)


ENGINE_PROFILE = "cpu"  # where vLLM and the torch engine measure the same cells
ENGINE_GRID = ({(b, 3, p) for b in (1, 4, 16) for p in ("draft", "ngram")}
               | {(b, k, p) for b in (1, 4, 16) for k in (1, 2, 4, 5, 6) for p in ("draft", "ngram")}
               | {(b, 0, "none") for b in (1, 4, 16, 32, 64)} | {(b, 3, "draft") for b in (32, 64)})


def engines() -> list[dict]:
    """G12: the production engine measured beside ours, and how far they agree (profile cpu)."""
    from . import fidelity

    def run():
        sp = analysis.speedup(ENGINE_PROFILE, "batch")
        src = f"data/raw/{ENGINE_PROFILE}/batch"
        got = {e: set(zip(g["batch"], g["k"], g["proposer"])) for e, g in sp.groupby("engine")}
        rows = [_row(f"G12a {e}", f"batch-study cells measured by {e} (k 0-6 at bs 1/4/16, draft and n-gram; "
                     "k 0/3 at bs 1-64)", "every cell", f"{len(got.get(e, set()) & ENGINE_GRID)}/{len(ENGINE_GRID)}",
                     ENGINE_GRID <= got.get(e, set()), src) for e in ("vllm", "torch")]
        eng = fidelity.engines(ENGINE_PROFILE, "batch")
        sd = eng[(eng["k"] > 0) & (eng["batch"] <= 16)]
        agree = int((sd["verdict"] == "agree").sum())
        rows.append(_row("G12b", "SD speedup, torch engine vs vLLM, per cell (95% CIs overlap)", "agree in every cell",
                         f"{agree}/{len(sd)} cells agree", bool(len(sd)) and agree == len(sd), src,
                         "; ".join(f"bs{int(r.batch)} {r.proposer} k{int(r.k)}: vLLM {r.vllm_speedup:.2f}x, torch "
                                   f"{r.torch_speedup:.2f}x" for r in sd.itertuples())))
        rows.append(_row("G12c", "SD speedup torch / vLLM, bs 1-16", "within 10% in every cell",
                         f"{sd['speedup_ratio'].min():.2f}-{sd['speedup_ratio'].max():.2f}" if len(sd) else "n/a",
                         bool(len(sd)) and bool(((sd["speedup_ratio"] - 1).abs() <= 0.10).all()), src))
        base = eng.groupby("batch")[["base_ratio", "base_ratio_probe"]].median()
        rows.append(_row("G12d", "no-SD throughput torch / vLLM, bs 1-64 (median per batch size)", ">= 0.9 at every "
                         "measured batch size", ", ".join(f"bs{b}: {r.base_ratio:.2f}" for b, r in base.iterrows()),
                         bool(len(base)) and bool((base["base_ratio"] >= 0.9).all()), src,
                         "per unit of probed bandwidth: " + ", ".join(f"bs{b}: {r.base_ratio_probe:.2f}"
                                                                      for b, r in base.iterrows())))
        return rows
    return _try("G12", "engine fidelity", "", run)


ACC_TOLERANCE = 0.05  # |vLLM - torch| per-position acceptance, probability; set before the cells were measured


def engine_acceptance(profile: str = ENGINE_PROFILE) -> list[dict]:
    """G12e: per-position acceptance of vLLM (its spec-decode counters) and the torch engine on the same greedy
    real-acceptance cells of the acceptance study (same prompts, so the same tokens are expected)."""
    from . import fidelity

    def run():
        acc = fidelity.acceptance(profile)
        acc = acc[acc["temperature"] == 0]
        if acc.empty:
            raise SpecdecError(f"no greedy real-acceptance cell of acceptance/{profile} was measured by both engines")
        worst = float(acc["diff"].abs().max())
        cells = acc.groupby(["batch", "k", "proposer"], sort=True)
        detail = "; ".join(f"bs{b} k{k} {p}: vLLM " + "/".join(f"{v:.2f}" for v in g["vllm_p"]) + ", torch "
                           + "/".join(f"{v:.2f}" for v in g["torch_p"]) for (b, k, p), g in cells)
        return [_row("G12e", "per-position acceptance, vLLM vs torch engine, greedy real-acceptance cells of the "
                     "acceptance study (same prompts)", f"within {ACC_TOLERANCE} at every position",
                     f"max |diff| {worst:.3f} over {cells.ngroups} cell(s) x positions",
                     bool(worst <= ACC_TOLERANCE), f"data/raw/{profile}/acceptance", detail)]
    return _try("G12e", "per-position acceptance, vLLM vs torch engine", f"within {ACC_TOLERANCE}", run)


def raw_data() -> list[dict]:
    """G0: every complete raw run is readable (a corrupt one would be left out of every table and verdict)."""
    from ..data import rawdata

    complete, partial, bad = rawdata.scan_all()
    return [_row("G0", "every complete raw run under data/raw is readable (meta.json keys, parquet tables)",
                 "0 corrupt runs", f"{len(bad)} corrupt of {len(complete) + len(bad)}", not bad, "data/raw",
                 "; ".join(f"{f.parent.parent.name}/{f.parent.name}/{f.name}: {why}" for f, why in bad)
                 + (f" ({len(partial)} partial run(s) set aside from loading)" if partial else ""))]


def paper_measured() -> list[dict]:
    """G13: predictions against the paper's measured end-to-end speedups (cnn + sharegpt, H100, vLLM, k=3), after
    the end-to-end calibration, each series predicted by a correction learnt without it."""
    def run():
        df = views.paper_measured()
        worst = df.loc[df["abs_pct_err_calibrated_cv"].idxmax()]
        return [_row("G13", "predicted vs the paper's measured speedups, cnn + sharegpt, bs 1-128, k=3 "
                            "(calibrated end to end, leave-one-series-out)", "MAPE <= 3%",
                     f"{df.attrs['mape_calibrated_cv']:.2f}% over {len(df)} cells",
                     df.attrs["mape_calibrated_cv"] <= 3,
                     "data/traces/llama3.1-8b-h100/paper-measured-speedups.csv + configs/hardware/h100.yaml costs",
                     f"correction chosen: {df.attrs['calibration']}; uncalibrated {df.attrs['mape_predicted']:.2f}%, "
                     f"the paper's simulator {df.attrs['mape_simulator']:.2f}%; worst {worst['abs_pct_err_calibrated_cv']:.1f}% "
                     f"({worst['dataset']} {worst['proposer']} bs{worst['batch']}: measured {worst['measured']:.2f}, "
                     f"predicted {worst['calibrated_cv']:.2f})")]
    return _try("G13", "predictions vs the paper's measured speedups", "MAPE <= 3%", run)


def table(check) -> pd.DataFrame:
    """Every goal, one row each; `check` as for profiles()."""
    return pd.DataFrame(raw_data() + paper_reference() + paper_measured() + cpu_validation() + regime()
                        + ngram_acceptance() + profiles(check) + bench() + engines() + engine_acceptance())


def to_markdown(df: pd.DataFrame) -> str:
    cols = ["goal", "statement", "target", "value", "met", "source", "detail"]
    esc = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(esc(r[c]) for c in cols) + " |" for _, r in df.iterrows()]
    met = int((df["met"] == "yes").sum())
    return (f"# Goals: {met} of {len(df)} met\n\nComputed from data/raw, data/traces and the configs; "
            f"'not evaluated' means an input is missing (see detail).\n\n" + "\n".join(lines) + "\n")
