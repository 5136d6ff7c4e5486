"""What the notebooks show for a profile: MEASURED tables where raw runs exist, else PREDICTED ones.

For a study with complete raw runs in data/raw/<profile>/<study>/ every view returns the `analysis` table
unchanged. Otherwise, where a trace collection (data/traces, see traces.py) and a cost source for its pair on
this profile exist (costmodel.load: published coefficients, e.g. the paper's H100 fit, else a roofline prior),
the view returns predicted.py's table of the same name, with `basis` = "predicted" (or "traced") and `source`
naming both inputs: the columns the figures read, not every measured column (the measured tables also carry
run ids, CIs and counters a prediction has no value for). One decision per view, `_pick`. Studies that cannot
be predicted (alternatives, bench) return empty tables and a reason. `mode()` says which of the three
applies to the raw studies a view reads (predicted.STUDIES are the ones that can be predicted); studies.mode and
studies.check ask it for each study's declared SOURCE.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..data import hardware, tables
from ..data import traces as tr
from ..errors import SpecdecError
from ..model import costmodel, predict, replay
from . import advise, analysis, predicted
from .predicted import BATCHES, K_PAPER, inputs


@dataclass(frozen=True)
class Source:
    kind: str  # measured | predicted | none
    text: str

    @property
    def label(self) -> str:
        return {"measured": "MEASURED", "predicted": "PREDICTED", "none": "NO DATA"}[self.kind] + ": " + self.text


def measured(profile: str, study: str) -> bool:
    """True when data/raw/<profile>/<study> (a raw study) has complete runs under the current config (or imported
    ones)."""
    return tables.has_runs(profile, study)


def synthetic(profile: str, study: str) -> bool:
    """True when the study's current runs on `profile` are of synthetic weights (meta.json `weights`), i.e. their
    timings are real and their acceptance replayed from traces."""
    from ..data import rawdata
    return any(m.get("weights") == "synthetic" for _, m in rawdata.current_runs(study, profile, warn=lambda _m: None))


def mode(profile: str, sources) -> Source:
    """Whether a view of the raw study `sources` (or of several: a tuple, e.g. a study shown from the batch,
    hardware and acceptance runs) on `profile` is shown measured (any of them has runs), predicted (all of them
    are in predicted.STUDIES and the profile has a prediction source), or not at all (with the reason). Raw
    runs of a profile without a yaml (imported or hand-made runs) count as measured. studies.mode(stem, profile)
    asks this with the study's declared SOURCE."""
    raw = (sources,) if isinstance(sources, str) else tuple(sources)
    shown = raw[0] if len(raw) == 1 else "*"
    if any(measured(profile, s) for s in raw):
        where = f"data/raw/{profile}/{shown}"
        if synthetic(profile, raw[0]):
            where += (" (synthetic weights of the real shapes: timings real" +
                      ("" if raw == ("hardware",) else ", acceptance replayed from the paper's traces") + ")")
        return Source("measured", where)
    if not set(raw) <= set(predicted.STUDIES):
        need = next(s for s in raw if s not in predicted.STUDIES)
        return Source("none", f"no measurements in data/raw/{profile}/{shown}, and the {need} study needs them "
                              f"(it cannot be predicted from acceptance traces and forward costs)")
    try:
        hardware.load_profile(profile)
        name, costs = inputs(profile)
    except SpecdecError as e:
        return Source("none", f"no measurements in data/raw/{profile}/{shown}; {e}")
    return Source("predicted", f"traces data/traces/{name} + costs {costs.describe()}")


# -- batch ----------------------------------------------------------------------------------------------------
def speedup(profile: str) -> pd.DataFrame:
    """analysis.speedup(profile, "batch") where measured, else predicted.speedup (same columns + basis, source)."""
    return _pick(profile, "batch",
                 lambda: analysis.speedup(profile, "batch").assign(basis="measured", source=f"data/raw/{profile}/batch"),
                 lambda: predicted.speedup(profile).copy())


def _require_predictable(profile: str, study: str) -> None:
    src = mode(profile, study)
    if src.kind == "none":
        raise SpecdecError(src.text)


def _two(first, second, profile: str, study: str) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(first table, second table, the first's note) of two analysis functions over the same runs."""
    a, note = analysis.safe(first, profile, study)
    b, _ = analysis.safe(second, profile, study)
    return a, b, note


def _pick(profile: str, study: str, measured_tables, predicted_tables):
    """The one measured-or-predicted decision of a view: measured_tables() where `study` has raw runs on `profile`,
    else predicted_tables() (predicted.py) where the study can be predicted there, else the reason as a
    one-line error."""
    if measured(profile, study):
        return measured_tables()
    _require_predictable(profile, study)
    return predicted_tables()


def draft_overhead(profile: str) -> tuple[pd.DataFrame, str]:
    """(table, note): share of step time spent proposing; predicted from the cost model at k=3."""
    return _pick(profile, "batch", lambda: analysis.safe(analysis.draft_overhead, profile, "batch"),
                 lambda: (predicted.draft_overhead(profile), ""))


def contention(profile: str) -> pd.DataFrame:
    if measured(profile, "batch"):
        return analysis.contention(profile, "batch")
    return pd.DataFrame({"run_id": [], "suspect": []})


def engines(profile: str) -> tuple[pd.DataFrame, str]:
    """(fidelity.engines table, note): vLLM vs the torch engine on the same cells; measured only."""
    from . import fidelity
    if not measured(profile, "batch"):
        return pd.DataFrame(), f"no measurements on {profile}: engine fidelity is measured, never predicted"
    return analysis.safe(fidelity.engines, profile, "batch")


def acceptance_engines(profile: str) -> tuple[pd.DataFrame, str]:
    """(fidelity.acceptance table, note): per-position acceptance of vLLM and the torch engine on the same
    real-acceptance cells of the acceptance study; measured only."""
    from . import fidelity
    if not measured(profile, "acceptance"):
        return pd.DataFrame(), f"no measurements on {profile}: engine fidelity is measured, never predicted"
    return analysis.safe(fidelity.acceptance, profile, "acceptance")


def vllm_steps(profile: str) -> tuple[pd.DataFrame, str]:
    """(fidelity.vllm_step_split table, note): where vLLM's step time goes; measured only."""
    from . import fidelity
    if not measured(profile, "batch"):
        return pd.DataFrame(), f"no measurements on {profile}"
    return analysis.safe(fidelity.vllm_step_split, profile, "batch")


def roofline(profile: str) -> tuple[pd.DataFrame, str]:
    """(fidelity.roofline table, note): batch-1 cells against the read-bandwidth bound; measured only."""
    from . import fidelity
    if not measured(profile, "batch"):
        return pd.DataFrame(), f"no measurements on {profile}: the roofline compares measured cells"
    return analysis.safe(fidelity.roofline, profile, "batch")


# -- acceptance -------------------------------------------------------------------------------------------------
def position_acceptance(profile: str) -> tuple[pd.DataFrame, str]:
    """Per-position conditional acceptance; predicted: the published traces replayed at k = 6."""
    return _pick(profile, "acceptance", lambda: analysis.safe(analysis.position_acceptance, profile, "acceptance"),
                 lambda: (predicted.position_acceptance(profile), ""))


def request_acceptance(profile: str) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(per-request table, summary, note); traced: per-request acceptance at k = 3 from the replay."""
    return _pick(profile, "acceptance",
                 lambda: _two(analysis.request_acceptance, analysis.acceptance_summary, profile, "acceptance"),
                 lambda: (predicted.request_acceptance(profile), predicted.acceptance_summary(profile), ""))


def iid_prediction(profile: str) -> tuple[pd.DataFrame, str]:
    """Tokens per step from the traces vs the i.i.d. formula at the same pooled acceptance, k = 1..6."""
    return _pick(profile, "acceptance", lambda: analysis.safe(analysis.iid_prediction, profile, "acceptance"),
                 lambda: (predicted.iid_prediction(profile), ""))


def break_even(profile: str) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(speedup vs i.i.d. alpha per batch size, break-even per batch size, note).

    Measured: the synthetic-acceptance cells. Predicted: predicted.synthetic_speedup and predicted.break_even."""
    return _pick(profile, "acceptance",
                 lambda: _two(analysis.synthetic_speedup, analysis.break_even, profile, "acceptance"),
                 lambda: (predicted.synthetic_speedup(profile), predicted.break_even(profile), ""))


# -- hardware -------------------------------------------------------------------------------------------------
def forward_times(profile: str) -> pd.DataFrame:
    """analysis.forward_times where measured; else the cost model's target forwards and draft steps."""
    return _pick(profile, "hardware", lambda: analysis.forward_times(profile, "hardware").assign(basis="measured"),
                 lambda: predicted.forward_times(profile))


def forward_ratio(profile: str) -> pd.DataFrame:
    """analysis.forward_ratio where measured; else EAGLE step / target verify time at the same query."""
    return _pick(profile, "hardware", lambda: analysis.forward_ratio(profile, "hardware").assign(basis="measured"),
                 lambda: predicted.forward_ratio(profile))


def summary_cells(profile: str, study: str) -> int:
    """Complete raw cells of a study (0 when predicted)."""
    return len(tables.runs(profile, study)) if tables.has_runs(profile, study) else 0


# -- validation on the paper's own numbers ----------------------------------------------------------------------
def reference_path(name: str):
    return tr.traces_root() / name / "simulator-speedups.csv"


def reference(name: str) -> pd.DataFrame:
    """The paper's simulator's speedups (dataset, proposer, batch, k, speedup), produced by running its
    main.py on its own data (see README); missing file is a one-line error."""
    path = reference_path(name)
    if not path.exists():
        raise SpecdecError(f"no simulator reference numbers at {path}")
    return pd.read_csv(path)


def _trace_predictor(name: str, dataset: str, proposer: str, costs):
    """(TraceSet, mean prompt P and output G of its replayed requests [tokens], f(batch, k) -> advise's
    predicted speedup for that trace set, prefill counted at P and G)."""
    ts = tr.load(name, dataset, proposer)
    acc = predict.replay_acceptance(ts, predict.K_MAX)
    P = float(np.mean([r.prompt_len for r in replay.sample(ts)]))
    G = float(np.mean([r.generated_len for r in replay.sample(ts)]))

    def at(batch: int, k: int) -> float:
        return float(predict.predict(costs, acc, batch, k, P + G / 2, proposer, n_boot=0, prefill=(P, G)).speedup)
    return ts, P, G, at


PAPER_PROFILE = "h100"  # where the paper measured (Llama-3.1-8B-Instruct, vLLM 0.10.1, k=3)


def paper_measured(calibrated: bool = True) -> pd.DataFrame:
    """The paper's own measured end-to-end speedups (paper-measured-speedups.csv beside the simulator's numbers:
    cnn and sharegpt, k=3, bs 1/16/64/128, read from its project page +-0.01) next to our prediction (advise's
    model, per-request steady state with prefill, under the h100 cost source) and the paper's simulator at the
    same cell. Nothing is fitted to them. attrs: mape_predicted, mape_simulator (%), cost_source."""
    name, costs = inputs(PAPER_PROFILE)
    path = tr.traces_root() / name / "paper-measured-speedups.csv"
    if not path.exists():
        raise SpecdecError(f"no measured reference numbers at {path}")
    meas = pd.read_csv(path)
    sim = reference(name).set_index(["dataset", "proposer", "batch", "k"])["speedup"]
    rows = []
    for (ds, prop), g in meas.groupby(["dataset", "proposer"]):
        ts, _, _, predict_at = _trace_predictor(name, ds, prop, costs)
        for r in g.itertuples():
            pred = predict_at(int(r.batch), int(r.k))
            rows.append({"dataset": ds, "proposer": prop, "batch": int(r.batch), "k": int(r.k),
                         "measured": float(r.speedup), "predicted": float(pred),
                         "simulator": float(sim.get((ds, prop, int(r.batch), int(r.k)), np.nan)),
                         "held_out": ts.held_out})
    df = pd.DataFrame(rows)
    for col in ("predicted", "simulator"):
        df[f"abs_pct_err_{col}"] = (df[col] - df["measured"]).abs() / df["measured"] * 100
    df.attrs["mape_predicted"] = float(df["abs_pct_err_predicted"].mean())
    df.attrs["mape_simulator"] = float(df["abs_pct_err_simulator"].mean())
    df.attrs["cost_source"] = costs.describe()
    if not calibrated:  # e.g. advise's certainty line: the calibration's CV fits take seconds
        return df
    cal = paper_calibration()
    # calibrated: the published fit with the end-to-end correction, each series predicted by the correction
    # learnt without it (leave-one-series-out); the same as `predicted` when the correction chose no term
    df["calibrated_cv"] = [cal.cv_predictions.get((r.dataset, r.proposer, r.batch, r.k), np.nan)
                           for r in df.itertuples()]
    df["abs_pct_err_calibrated_cv"] = (df["calibrated_cv"] - df["measured"]).abs() / df["measured"] * 100
    df.attrs["mape_calibrated_cv"] = float(df["abs_pct_err_calibrated_cv"].mean())
    df.attrs["calibration"] = "+".join(cal.terms) or "no term"
    return df


def paper_calibration():
    """The paper's H100 fit calibrated end-to-end on its measured cnn + sharegpt speedups (calibrate.py)."""
    from ..model import calibrate
    name, _ = inputs(PAPER_PROFILE)
    path = tr.traces_root() / name / "paper-measured-speedups.csv"
    if not path.exists():
        raise SpecdecError(f"no measured reference numbers at {path}")
    return calibrate.paper(name, str(path), PAPER_PROFILE)


def calibration_candidates() -> pd.DataFrame:
    """Every candidate correction with its leave-one-series-out CV MAPE and in-sample MAPE (%), `chosen` marked."""
    return paper_calibration().candidates


def validate_against_reference(profile: str, held_out: bool = True) -> pd.DataFrame:
    """Our predictions vs the paper's simulator on the (held-out) datasets: `advise`'s model (per-request
    steady state, tokens per step conditioned on k by each request's replay, prefill counted; predicted)
    and the full trace replay (replayed).
    attrs: mape (steady state, %), mape_replay (%), cost_source."""
    name, costs = inputs(profile)
    ref = reference(name)
    keep = set(tr.datasets(name, held_out=held_out)) if held_out is not None else set(tr.datasets(name))
    ref = ref[ref["dataset"].isin(keep)]
    rows = []
    for (ds, prop), g in ref.groupby(["dataset", "proposer"]):
        ts, P, G, predict_at = _trace_predictor(name, ds, prop, costs)
        for r in g.itertuples():
            pred = predict_at(int(r.batch), int(r.k))
            rep = replay.speedup(ts, costs, int(r.batch), int(r.k), n_boot=0)["speedup"]
            rows.append({"dataset": ds, "proposer": prop, "batch": int(r.batch), "k": int(r.k), "context": P + G / 2,
                         "measured": r.speedup, "predicted": float(pred), "replayed": rep,
                         "held_out": ts.held_out})
    df = pd.DataFrame(rows)
    df["abs_pct_err"] = (df["predicted"] - df["measured"]).abs() / df["measured"] * 100
    df["abs_pct_err_replay"] = (df["replayed"] - df["measured"]).abs() / df["measured"] * 100
    df.attrs["mape"] = float(df["abs_pct_err"].mean())
    df.attrs["mape_replay"] = float(df["abs_pct_err_replay"].mean())
    df.attrs["cost_source"] = costs.describe()
    return df


def k_choice(profile: str, held_out: bool = True, ks=range(1, predict.K_MAX + 1)) -> pd.DataFrame:
    """Per dataset x proposer x batch: the k that `advise` recommends (steady-state model) and the best k of
    the trace replay (ground truth under the same costs), with the replayed speedup of each; `regret` =
    1 - speedup(recommended) / speedup(best) (goal <= 2%)."""
    name, costs = inputs(profile)
    rows = []
    for ds in tr.datasets(name, held_out=held_out):
        for prop in tr.PROPOSERS:
            ts = tr.load(name, ds, prop)
            for b in BATCHES:
                adv = advise.advise(ts.pair, profile, b, traces=f"{name}/{ds}", proposer=prop, n_boot=0, prefill=True)
                rec = adv.best_k
                scores = {0: 1.0, **{k: replay.speedup(ts, costs, b, k, n_boot=0)["speedup"] for k in ks}}
                best = max(scores, key=scores.get)
                got = scores.get(rec, np.nan)
                rows.append({"dataset": ds, "proposer": prop, "batch": b, "recommended_k": rec, "best_k": best,
                             "speedup_recommended": got, "speedup_best": scores[best],
                             "regret": 1 - got / scores[best]})
    return pd.DataFrame(rows)


def validation(profile: str) -> tuple[pd.DataFrame, str, str]:
    """(table, note, what the predictions are compared with).

    Measured profiles: advise.validate (held-out batch-study cells). A profile whose trace collection comes
    with the paper's simulator numbers (h100): our predictions vs those numbers on the held-out datasets.
    Other predicted profiles: nothing to validate against (empty table, the reason)."""
    if measured(profile, "batch"):
        try:
            return advise.validate(profile), "", "measured"
        except SpecdecError as e:
            return pd.DataFrame(), str(e), "measured"
    src = mode(profile, "batch")  # batch is not measured here: what predicts it
    if src.kind == "none":
        return pd.DataFrame(), src.text, "measured"
    name, _ = inputs(profile)
    if tr.source(name)["profile"] != profile or not reference_path(name).exists():
        return pd.DataFrame(), (f"no measurement or published reference on '{profile}' to validate against; the "
                                f"predictions use {src.text}"), "measured"
    return validate_against_reference(profile, held_out=True), "", "paper's simulator"


def policy(profile: str, fixed_k: int = K_PAPER) -> tuple[pd.DataFrame, str]:
    """Off vs fixed k vs adaptive k per batch size. Measured profiles: advise.policy_compare. Predicted:
    for EAGLE on the held-out datasets (mean over them), `predicted` = the steady-state model of `advise`,
    `measured` = the trace replay at that k (the simulator's protocol) under the same costs."""
    if measured(profile, "batch"):
        return analysis.safe(advise.policy_compare, profile)
    src = mode(profile, "batch")  # batch is not measured here: what predicts it
    if src.kind == "none":
        return pd.DataFrame(), src.text
    name, costs = inputs(profile)
    rows = []
    for ds in tr.datasets(name, held_out=True):
        ts = tr.load(name, ds, "eagle")
        acc = predict.replay_acceptance(ts, predict.K_MAX)
        P = float(np.mean([r.prompt_len for r in ts.requests]))
        G = float(np.mean([r.generated_len for r in ts.requests]))
        for b in BATCHES:
            best = advise.advise(ts.pair, profile, b, traces=f"{name}/{ds}", proposer="eagle", n_boot=0,
                                  prefill=True).best_k
            for pol, k in (("off", 0), (f"fixed k={fixed_k}", fixed_k), ("adaptive", best)):
                pred = predict.predict(costs, acc, b, k, P + G / 2, "eagle", n_boot=0, prefill=(P, G)).speedup \
                    if k else 1.0
                meas = replay.speedup(ts, costs, b, k, n_boot=0)["speedup"] if k else 1.0
                rows.append({"dataset": ds, "batch": b, "policy": pol, "k": k, "predicted": pred, "measured": meas})
    df = pd.DataFrame(rows)
    out = df.groupby(["batch", "policy"], as_index=False, sort=False).agg(
        k=("k", "max"), predicted=("predicted", "mean"), measured=("measured", "mean"))
    out["measured_ks"] = "replay"
    return out, ""


def alternatives(profile: str) -> tuple[pd.DataFrame, str]:
    return analysis.safe(analysis.alternatives, profile, "alternatives")


def bench(profile: str) -> tuple[pd.DataFrame, str]:
    return analysis.safe(analysis.bench, profile)


# -- decision map ------------------------------------------------------------------------------------------------
MAP_ALPHAS = np.round(np.arange(0.0, 0.96, 0.025), 3)
MAP_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def _iid_alpha(tokens_per_step: float, k: int) -> float:
    """The i.i.d. acceptance alpha whose expected tokens per step at k equals `tokens_per_step` (NaN outside)."""
    if not (1 <= tokens_per_step <= k + 1) or not np.isfinite(tokens_per_step):
        return np.nan
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if analysis.iid_tokens_per_step(mid, k) < tokens_per_step else (lo, mid)
    return (lo + hi) / 2


def decision_map(profile: str, context: float = predict.DEFAULT_CONTEXT) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(map, points, note). map: predicted best SD speedup (draft model or EAGLE head, best k in 1..K_MAX) over
    batch size x i.i.d. acceptance alpha, steady state at `context` KV tokens, under the profile's cost source
    (columns batch, alpha, best_k, speedup). points: the profile's measured draft-model / EAGLE cells at k > 0
    (batch, k, alpha = the i.i.d. alpha with their measured tokens per sequence-step, speedup with CI, engine,
    trace), so where model and measurement disagree is visible. n-gram cells are left out (no draft cost)."""
    from ..data import config as cfgmod
    if measured(profile, "batch"):
        pair = cfgmod.load_study("batch", profile)["pair"] if profile in hardware.profile_names() else None
        costs = costmodel.load(profile, pair) if pair else None
    else:
        _, costs = inputs(profile)
    if costs is None:
        return pd.DataFrame(), pd.DataFrame(), f"no cost source for '{profile}'"
    rows = []
    for b in MAP_BATCHES:
        base = costs.step_s(b, 0, context)
        for a in MAP_ALPHAS:
            sp = {k: analysis.iid_tokens_per_step(a, k) * base / costs.step_s(b, k, context, "draft")
                  for k in range(1, predict.K_MAX + 1)}
            k = max(sp, key=sp.get)
            rows.append({"batch": b, "alpha": float(a), "best_k": k, "speedup": float(sp[k])})
    grid = pd.DataFrame(rows)
    pts = pd.DataFrame()
    if measured(profile, "batch"):
        sp, _ = analysis.safe(analysis.speedup, profile, "batch")
        if len(sp):
            from . import fidelity
            sp = sp[(sp["k"] > 0) & sp["proposer"].isin(["draft", "eagle", "eagle3"])].copy()
            # acceptance per proposing step (both engines' counters), not diluted by finished sequences
            sp["tokens_per_step"] = sp["run_id"].map(fidelity.tokens_per_step(profile, "batch"))
            sp["alpha"] = [_iid_alpha(t, int(k)) for t, k in zip(sp["tokens_per_step"], sp["k"])]
            keep = [c for c in ("engine", "trace", "batch", "k", "proposer", "alpha", "tokens_per_step",
                                "speedup", "ci_lo", "ci_hi") if c in sp]
            pts = sp[keep].reset_index(drop=True)
    note = (f"costs: {costs.describe()}; context {context:.0f} KV tokens/seq; proposer draft model / EAGLE head "
            f"({'measured cells overlaid' if len(pts) else 'no measured draft-model cells on this profile'})")
    return grid, pts, note
