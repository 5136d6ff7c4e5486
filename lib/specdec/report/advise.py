"""Advice and validation: the model's predictions (model/predict.py) for a setting, with how sure they are, and
checked against this profile's measured batch-study cells.

  advise(pair, profile, batch, ...) -> Advice   what `python -m specdec advise` prints: best k, predicted speedup
                                                 with its interval, break-even, vLLM config, and certainty()
  validate(profile) -> DataFrame                 predicted vs measured speedup of every measured SD cell
  policy_compare(profile) -> DataFrame           off vs fixed k vs the predicted best k per batch size
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..data import hardware, tables
from ..errors import SpecdecError
from ..model import acceptance, costmodel
from ..model.acceptance import AcceptanceModel
from ..model.costmodel import CostModel
from ..model.predict import (ADVISE_MAX_BATCH, DEFAULT_CONTEXT, K_MAX, MAX_BATCH, MAX_TOKENS, PROPOSERS,
                             Prediction, best_break_even_alpha, break_even_alpha, break_even_tokens,
                             load_acceptance, optimal_k, policy, predict, sd_step_s, speedup, static_finish,
                             static_seconds, vllm_speculative_config)
from . import analysis


@dataclass
class Advice:
    pair: str
    profile: str
    batch: int
    context: float
    enable: bool
    k: int  # the k the prediction is for (best k > 0, or the requested one)
    requested: bool  # k came from the caller
    best_k: int  # 0 = no SD
    prediction: Prediction
    break_even_tokens: float
    break_even_alpha: float | None
    best_break_even: tuple  # (lowest break-even i.i.d. alpha over k = 1..K_MAX, its k), or (None, None)
    costs: CostModel
    acc: object
    vllm: dict | None
    proposer: str = "draft"
    prefill: tuple | None = None
    ranges: list | None = None
    certainty: str = ""  # how sure: cost source, its validation error, the nearest measured cell

    def lines(self) -> list[str]:
        """A few human-readable lines (what `python -m specdec advise` prints)."""
        p = self.prediction
        if self.k == 0:
            verdict = "k=0 is decoding without SD"
        elif self.requested:
            verdict = f"{'ENABLE' if self.enable else 'DO NOT ENABLE'} SD at the requested k={self.k}"
        else:
            verdict = f"ENABLE SD with k={self.k}" if self.enable else "DISABLE SD (k=0)"
        best_a, best_at = self.best_break_even
        best = (f"no k in 1..{K_MAX} breaks even" if best_a is None
                else f"lowest over k=1..{K_MAX}: i.i.d. alpha > {best_a:.2f} (k={best_at})")
        pre = (f", prefill of {self.prefill[0]:.0f} prompt tokens counted over {self.prefill[1]:.0f} output tokens"
               if self.prefill else ", prefill not counted")
        if self.k == 0:
            pred, even = "predicted speedup at k=0: 1.00x by definition", f"break-even: {best}"
        else:
            alpha = (f"unreachable: k={self.k} gives at most {self.k + 1}" if self.break_even_alpha is None
                     else f"i.i.d. alpha > {self.break_even_alpha:.2f}")
            pred = (f"predicted speedup at k={self.k}: {p.speedup:.2f}x "
                    f"({p.level:.0%} interval {p.lo:.2f}-{p.hi:.2f}){pre}; "
                    f"tokens/step {p.tokens_per_step:.2f} (i.i.d. alpha {self.acc.iid_alpha:.2f} would give "
                    f"{p.iid_tokens_per_step:.2f}); step {p.step_s * 1e3:.3g} ms vs {p.base_step_s * 1e3:.3g} ms "
                    f"without SD")
            even = f"break-even at k={self.k}: tokens/step > {self.break_even_tokens:.2f} ({alpha}); {best}"
        spec = (f"vLLM --speculative-config '{json.dumps(self.vllm)}'" if self.vllm else
                "vLLM: run without --speculative-config (SD off)" if not self.enable or self.k == 0 else
                f"vLLM: no hub id for this pair's {self.proposer} proposer; cannot write a --speculative-config")
        return [
            f"recommendation: {verdict} for {self.pair} on {self.profile} at batch {self.batch} "
            f"({self.context:.0f} KV tokens/seq, proposer {self.proposer}); best k in 0..{min(K_MAX, self.acc.max_k)}: "
            f"{self.best_k}",
            pred,
            even,
            f"costs: {self.costs.describe()}",
            *([f"how sure: {self.certainty}"] if self.certainty else []),
            f"acceptance: {self.acc.describe()}",
            spec,
            "best k per batch-size range [first, last, k]: " + json.dumps(self.ranges),
        ]


def advise(pair: str, profile: str, batch: int, k: int | None = None, traces: str | None = None,
           context: float | None = None, proposer: str = "draft", n_boot: int = 300, seed: int = 0,
           prefill: bool = False, prompt_tokens: float | None = None,
           output_tokens: float | None = None) -> Advice:
    """Recommendation for one batch size: enable SD or not, best k, speedup with interval, break-even.

    Acceptance comes from `traces` (see load_acceptance) or else the profile's raw traces; costs from
    costmodel.load (fitted, published in the profile yaml, or the roofline prior). `context` defaults to the
    traces' mean prompt + half their mean output, else DEFAULT_CONTEXT. With `prefill`, each request's prefill
    is counted (prompt/output tokens default to the traces' means, else 512 and 256)."""
    name = costmodel.pair_name(pair)
    hardware.load_profile(profile)
    if proposer not in PROPOSERS:
        raise SpecdecError(f"unknown proposer '{proposer}'; known: {', '.join(PROPOSERS)}")
    if proposer == "eagle" and not name.endswith("/eagle"):
        raise SpecdecError(f"pair '{name}' has no EAGLE head (its draft is a separate model): use --proposer "
                           f"draft or ngram, or an EAGLE pair such as llama3.1-8b/eagle")
    if not 1 <= batch <= ADVISE_MAX_BATCH:
        raise SpecdecError(f"batch must be an integer in 1..{ADVISE_MAX_BATCH}, got {batch}")
    if k is not None and not 0 <= k <= K_MAX:
        raise SpecdecError(f"k must be in 0..{K_MAX}, got {k}")
    for label, val in (("context", context), ("prompt tokens", prompt_tokens), ("output tokens", output_tokens)):
        if val is not None and not (math.isfinite(val) and 1 <= val <= MAX_TOKENS):
            raise SpecdecError(f"{label} must be a number of tokens in 1..{MAX_TOKENS:.0f}, got {val}")
    if not prefill and (prompt_tokens is not None or output_tokens is not None):
        raise SpecdecError("--prompt-tokens and --output-tokens count only with --prefill")
    acc, P, G = load_acceptance(traces, profile, name, proposer)
    if context is None:
        context = P + G / 2 if P is not None else DEFAULT_CONTEXT
    pre = None
    if prefill:
        pre = (float(prompt_tokens if prompt_tokens is not None else (P or 512)),
               float(output_tokens if output_tokens is not None else (G or 256)))
    costs = costmodel.load(profile, name)
    if proposer == "eagle" and costs.draft is None:
        raise SpecdecError(f"costs for {name} on {profile} have no draft/EAGLE cost")

    def value(j):
        return float(predict(costs, acc, batch, j, context, proposer, n_boot=0, prefill=pre).speedup)

    ks = range(1, min(K_MAX, acc.max_k) + 1)
    scores = {j: value(j) for j in ks}
    best = max(scores, key=scores.get)
    best = best if scores[best] > 1 else 0
    if k is None:
        k_eval = best or max(scores, key=scores.get)
    else:
        if k > 0:
            acc.conditionals(k)  # k beyond the traces: one-line error
        k_eval = k
    pred = predict(costs, acc, batch, k_eval, context, proposer, n_boot=n_boot, seed=seed, prefill=pre)
    ranges = policy(costs, acc, max(MAX_BATCH, batch), context, proposer)
    enable = pred.speedup > 1 and k_eval > 0
    return Advice(name, profile, batch, context, enable, k_eval, k is not None, best, pred,
                  float(break_even_tokens(costs, batch, max(k_eval, 1), context, proposer)),
                  break_even_alpha(costs, batch, max(k_eval, 1), context, proposer),
                  best_break_even_alpha(costs, batch, context, proposer), costs, acc,
                  vllm_speculative_config(name, proposer, k_eval) if enable else None, proposer, pre, ranges,
                  _quietly(certainty, profile, costs, proposer, batch, k_eval, pred.speedup))


def _quietly(fn, *args):
    with tables.quiet():
        return fn(*args)


SOURCE_KIND = {"steps": "end to end on this profile's batch-study steps (calibration cells of configs/batch.yaml)",
               "fitted": "forward microbenchmarks (fitted on data/raw/{p}/hardware)",
               "published": "published coefficients (configs/hardware/{p}.yaml)",
               "prior": "roofline prior from the spec sheet (no measurement)"}


def certainty(profile: str, costs: CostModel, proposer: str, batch: int, k: int, predicted: float) -> str:
    """One line: the cost source's kind, the validation error of that source where one exists (our measured
    batch cells on this profile, or the paper's measured speedups for the published H100 fit), and the
    nearest measured cell of this profile (same proposer where there is one) beside this prediction."""
    base = costs.source.split("+")[0]
    parts = ["cost source: " + SOURCE_KIND.get(base, base).format(p=profile)
             + (", calibrated end to end" if costs.source.endswith("+calibrated") else "")]
    measured = tables.has_runs(profile, "batch")
    try:
        if measured and base in ("fitted", "steps"):
            v = validate(profile)
            parts.append(f"its error on this profile's {'held-out ' if base == 'steps' else ''}measured cells: "
                         f"MAPE {v.attrs['mape']:.0f}% over {int(v['predicted'].notna().sum())} cells")
        elif base == "published" and profile == "h100":
            from . import views  # views builds on advise: imported here
            parts.append(f"its error on the paper's measured speedups (cnn, sharegpt): MAPE "
                         f"{views.paper_measured(calibrated=False).attrs['mape_predicted']:.1f}%")
        else:
            parts.append("not validated against measurements on this profile")
    except SpecdecError as e:
        parts.append(f"validation unavailable ({e})")
    if measured:
        try:
            sp = analysis.speedup(profile, "batch")
            sp = sp[sp["k"] > 0]
            same = sp[sp["proposer"] == proposer]
            sp = same if len(same) else sp
            if len(sp):
                dist = (np.log2(sp["batch"] / batch).abs() + (sp["k"] - k).abs()).to_numpy()
                near = sp[dist == dist.min()]  # every engine's (and replayed dataset's) cell at that distance
                each = ", ".join(f"bs{int(x['batch'])} k={int(x['k'])} {x['proposer']}"
                                 + "".join(f" {x[c]}" for c in ("engine", "trace") if c in near and
                                           near[c].nunique() > 1)
                                 + f" {x['speedup']:.2f}x ({x['ci_lo']:.2f}-{x['ci_hi']:.2f})"
                                 for _, x in near.iterrows())
                parts.append(f"nearest measured cell(s): {each}; this prediction {predicted:.2f}x")
        except SpecdecError:
            pass
    else:
        parts.append(f"no measured cell on {profile}")
    return "; ".join(parts)


def _cell_context(reqs: pd.DataFrame) -> float:
    """Mean KV columns per sequence during decode: the batch's padded prompt width plus half the output."""
    width = reqs.groupby(["repeat", "batch_idx"])["prompt_tokens"].max().mean()
    return float(width + reqs["new_tokens"].mean() / 2)


def validate(profile: str, pair: str | None = None, n_sim: int = 1000, seed: int = 0,
             per_request: bool = True, engine: str = "torch", n_boot: int = 0, level: float = 0.9) -> pd.DataFrame:
    """Predicted vs measured speedup for every SD cell of the batch study of `profile`.

    Costs are fitted end to end on the batch study's calibration cells where its config names some (those cells
    are then not validated: costmodel.fit_steps), else only on the hardware study; acceptance only on the
    acceptance study (real traces,
    same proposer and temperature); each batch-study cell is then predicted for its batch size, k, mean
    context and output length (static batching: the batch waits for its slowest sequence, see
    static_finish and `per_request`; a torch run under torch.finished retire sums the costs of its narrowing
    tail, static_seconds; an n-gram step verifies the mean width that the traces' proposal lengths give under
    the run's verify rule, predict.sd_step_s). Measured speedup = no-SD decode seconds per token / SD decode
    seconds per token at the same batch size (a paired cell's own interleaved no-SD batches, else the k=0
    cell); only `engine`'s cells (the cost model is fitted on the torch engine's forwards). Columns: cell keys, context, predicted, predicted_steady,
    measured, abs_pct_err [%], predicted/measured steps per batch, seconds per step and verify width (tokens per
    sequence: measured_width from the cell's steps or vLLM's counters, predicted_width), verify (the rule);
    df.attrs["mape"] = mean abs_pct_err [%], df.attrs["cost_source"] = how the costs were obtained. With
    n_boot > 0 also pred_lo/pred_hi (the `level` interval of the prediction: costs and acceptance resampled
    jointly and each replicate times a draw of the run-to-run noise, CostModel.run_log_sd, as advise's interval),
    model_lo/model_hi (the same without the noise) and covered, and df.attrs["coverage"] (fraction of cells
    covered), ["coverage_model"] (by model_lo/hi), ["run_log_sd"] and ["half_width"] (median half width of the
    interval as a fraction of the prediction: a wide enough interval covers anything)."""
    batches = tables.load(profile, "batch", "batches")
    reqs = tables.load(profile, "batch", "requests")
    pair = costmodel.pair_name(pair) if pair else str(batches["pair"].iloc[0])
    batches = batches[(batches["pair"] == pair) & (batches["engine"] == engine)]
    reqs = reqs[(reqs["pair"] == pair) & (reqs["engine"] == engine)]
    if batches.empty:
        raise SpecdecError(f"no {engine} batch-study cells of pair {pair} on {profile} to validate against")
    if engine == "vllm":
        batches = costmodel.decode_steps(batches)
    from ..data import config as cfgmod
    cal = cfgmod.analysis_settings("batch", profile)["calibration"]
    costs = costmodel.fit_steps(profile, cal, pair, engine) if cal else costmodel.fit(profile, pair)
    keys = ["batch", "temperature", "quant"]
    # torch runs under torch.finished: retire run a static batch's tail with its unfinished sequences only: their
    # steps (and so the fit) carry each step's own width, and the prediction sums the costs of those widths
    # (static_seconds). vLLM retires too, but its fit sees only each call's mean step at the cell's batch size,
    # which already averages the narrowing tail, so its prediction keeps full-width steps.
    runs = tables.runs(profile, "batch")
    retire = set(runs.loc[runs["finished"] == "retire", "run_id"]) if engine == "torch" else set()
    # what each run's SD step verified (an n-gram lookup may propose fewer than k tokens, or none): the rule
    # (tables.runs `verify`) sets the predicted width; the measured mean width is shown beside it
    rules = dict(zip(runs["run_id"], runs["verify"]))
    try:
        st = tables.load(profile, "batch", "steps") if engine != "vllm" else None
    except SpecdecError:  # runs without per-step records: no measured width
        st = pd.DataFrame(columns=["run_id", "engine", "k", "proposed"])
    widths = costmodel.measured_widths(st, batches, runs, engine)
    models: dict[tuple, AcceptanceModel | None] = {}
    rows = []
    own = batches[batches["arm"] == "cell"]
    for run_id, both in batches.groupby("run_id"):
        cell, paired_base = both[both["arm"] == "cell"], both[both["arm"] == "base"]
        c = cell.iloc[0]
        if c["k"] == 0 or costmodel.matches(run_id, cal):  # calibration cells are not validation cells
            continue
        base = paired_base if len(paired_base) else \
            own[(own["k"] == 0) & np.logical_and.reduce([own[key] == c[key] for key in keys])]
        if base.empty:
            continue
        mkey = (c["proposer"], float(c["temperature"]))
        if mkey not in models:
            try:
                found, where = acceptance.load_traces(profile, pair, *mkey, studies=("acceptance",))
                models[mkey] = AcceptanceModel.from_traces(found, where)
            except SpecdecError:
                models[mkey] = None
        acc = models[mkey]
        r = reqs[reqs["run_id"] == run_id]
        k, bs, ctx = int(c["k"]), int(c["batch"]), _cell_context(r)
        need = int(round(cell["decode_tokens"].sum() / cell["size"].sum()))
        measured = (base["decode_s"].sum() / base["decode_tokens"].sum()) / \
            (cell["decode_s"].sum() / cell["decode_tokens"].sum())
        n_steps, n_base = cell["steps"].sum(min_count=1), base["steps"].sum(min_count=1)  # NaN where unknown
        row = {"run_id": run_id, "batch": bs, "k": k, "proposer": c["proposer"], "temperature": c["temperature"],
               "context": ctx, "decode_tokens_per_seq": need, "measured": measured,
               "measured_steps": cell["steps"].mean(), "measured_step_s": cell["decode_s"].sum() / n_steps,
               "measured_base_step_s": base["decode_s"].sum() / n_base,
               "measured_width": widths.get(run_id, np.nan),
               "predicted_step_s": float(costs.step_s(bs, k, ctx, c["proposer"])),
               "predicted_base_step_s": float(costs.step_s(bs, 0, ctx))}
        if acc is not None:
            ext, prop, rule = k > acc.max_k, c["proposer"], rules.get(run_id, "k")

            def sd_seconds(cm, am, finish):
                """Predicted decode seconds of the cell's static batch under cost model cm, acceptance am."""
                if run_id in retire:
                    return static_seconds(finish, lambda m: sd_step_s(cm, am, m, k, ctx, prop, ext, rule))
                return float(finish.max(axis=1).mean()) * float(sd_step_s(cm, am, bs, k, ctx, prop, ext, rule))

            finish = static_finish(acc, k, bs, need, n_sim, seed, ext, per_request)
            steps = float(finish.max(axis=1).mean())
            row.update(predicted_steps=steps, extrapolated=ext, finished="retire" if run_id in retire else "keep",
                       verify=rule, predicted_step_s=float(sd_step_s(costs, acc, bs, k, ctx, prop, ext, rule)),
                       predicted_width=acc.verify_width(k, bs, rule, ext) if prop == "ngram" else k + 1.0,
                       predicted=need * row["predicted_base_step_s"] / sd_seconds(costs, acc, finish),
                       predicted_steady=float(speedup(costs, acc, bs, k, ctx, prop, ext, rule)))
            if n_boot:  # the interval advise would give: costs, acceptance and a cell's run-to-run noise
                rng = np.random.default_rng([seed, bs, k])
                reps, noise = [], []
                for i in range(n_boot):
                    cb, ab = costs.resample(rng), acc.resample(rng)
                    fb = static_finish(ab, k, bs, need, max(n_sim // 10, 50), seed + i, ext, per_request)
                    reps.append(need * cb.step_s(bs, 0, ctx) / sd_seconds(cb, ab, fb))
                    noise.append(costs.run_noise(rng))
                tail = (1 - level) / 2 * 100
                row["pred_lo"], row["pred_hi"] = (float(x) for x in np.percentile(np.multiply(reps, noise),
                                                                                   [tail, 100 - tail]))
                row["model_lo"], row["model_hi"] = (float(x) for x in np.percentile(reps, [tail, 100 - tail]))
        rows.append(row)
    if not rows:
        raise SpecdecError(f"no SD cells with a matching no-SD cell in data/raw/{profile}/batch")
    df = pd.DataFrame(rows)
    for col in ("predicted", "predicted_steady", "predicted_steps"):
        if col not in df:
            df[col] = np.nan
    df["abs_pct_err"] = (df["predicted"] - df["measured"]).abs() / df["measured"] * 100
    df = df.sort_values(["proposer", "batch", "k"], ignore_index=True)
    df.attrs["mape"] = float(df["abs_pct_err"].mean())
    df.attrs["cost_source"] = costs.describe()
    if n_boot and "pred_lo" in df:
        df["covered"] = (df["measured"] >= df["pred_lo"]) & (df["measured"] <= df["pred_hi"])
        df.attrs["coverage"] = float(df.loc[df["pred_lo"].notna(), "covered"].mean())
        model = (df["measured"] >= df["model_lo"]) & (df["measured"] <= df["model_hi"])
        df.attrs["coverage_model"] = float(model[df["model_lo"].notna()].mean())
        df.attrs["run_log_sd"] = float(costs.run_log_sd)
        df.attrs["half_width"] = float(((df["pred_hi"] - df["pred_lo"]) / 2 / df["predicted"]).median())
    return df


def policy_compare(profile: str, pair: str | None = None, fixed_k: int = 3, proposer: str = "draft",
                   context: float | None = None, engine: str = "torch") -> pd.DataFrame:
    """Off vs fixed k vs adaptive k (best predicted k per batch size), at each batch size of the batch study.

    Columns: batch, policy, k, predicted (speedup), measured (speedup of the batch-study cell with that k,
    NaN where that k was not measured), measured_ks (the k values measured at that batch size). Costs come
    from the hardware study and acceptance from the acceptance study of `profile`, as in validate(); measured
    speedups are analysis.speedup's (paired where the cells are) of `engine`'s cells."""
    sp = analysis.speedup(profile, "batch")
    pair = costmodel.pair_name(pair) if pair else str(sp["pair"].iloc[0])
    sp = sp[(sp["pair"] == pair) & (sp["engine"] == engine) & sp["proposer"].isin([proposer, "none"])]
    costs = costmodel.fit(profile, pair)
    found, where = acceptance.load_traces(profile, pair, proposer, 0.0, studies=("acceptance",))
    acc = AcceptanceModel.from_traces(found, where)
    if context is None:
        reqs = tables.load(profile, "batch", "requests")
        context = float(reqs["prompt_tokens"].mean() + reqs["new_tokens"].mean() / 2)
    measured = sp.groupby(["batch", "k"])["speedup"].first()
    rows = []
    for bs in sorted(sp["batch"].unique()):
        measured_ks = sorted(int(k) for k in measured.loc[bs].index)
        best_k, _ = optimal_k(costs, acc, int(bs), context, proposer)
        for name, k in (("off", 0), (f"fixed k={fixed_k}", fixed_k), ("adaptive", best_k)):
            k = min(k, acc.max_k) if k else 0
            meas = 1.0 if k == 0 else measured.get((bs, k), np.nan)
            rows.append({"batch": int(bs), "policy": name, "k": k, "measured_ks": measured_ks,
                         "predicted": float(speedup(costs, acc, int(bs), k, context, proposer)), "measured": meas})
    return pd.DataFrame(rows)

