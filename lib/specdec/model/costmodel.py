"""Forward-pass cost model per hardware profile: seconds for one forward of the target or the draft.

A forward appends `query` tokens to each of `batch` sequences that already hold `context` KV tokens; the
cost depends on batched tokens (batch*query) and KV tokens (batch*context). Three sources, always labelled:

  * "fitted": least squares on our own measurements (study "hardware", table "forwards"):
        t = a + b * (batch*query) + c * (batch*context) + d * [batch*query > 1] + e * (batch*query*context)
        [s, s/token, s/KV token, s, s per token-pair], all >= 0 (LinearCost),
    fitted on the median of the repeats of each (model, batch, query, context) point, with relative
    weights (minimises sum ((y - t)/y)^2, so small forwards count as much as big ones);
  * "prior": a roofline from the profile's spec sheet (configs/hardware/<name>.yaml: peak_tflops,
    mem_bw_tbs) and the pair's sizes (models.PAIRS: each pair's `sizes`), for profiles without measurements:
        t = overhead + max((weight_bytes + kv_bytes) / (eff_mem * bw), flops / (eff_flops * peak)),
    with the target's weight_bytes read at offload_link_tbs instead of bw on an offload profile.

  * "published": coefficients given in the profile yaml (configs/hardware/<name>.yaml, key `costs`, one
    entry per pair) with their provenance, e.g. the paper's fitted H100 model for Llama-3.1-8B + EAGLE:
        target forward  t = fixed_s + per_token_s * (batch*query) + per_kv_token_s * (batch*context)
        EAGLE draft step t = fixed_s + per_spec_token_s * (k+1) + per_kv_token_s * (batch*context)
        n-gram draft step t = ngram_draft_fraction * (target verify time); step_overhead_s per step.

`CostModel.resample` draws one bootstrap replicate (residual bootstrap of a fit, or random efficiencies
for the prior) for prediction intervals (see predict.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from ..data import hardware, models, tables
from ..data.models import ModelSize
from ..data.spec import PROPOSERS
from ..errors import SpecdecError


# Prior assumptions (documented guesses, not measurements): point value and bootstrap range.
PRIOR_EFF_MEM = (0.7, (0.5, 0.9))      # achieved fraction of spec-sheet memory bandwidth
PRIOR_EFF_FLOPS = (0.5, (0.3, 0.7))    # achieved fraction of spec-sheet dense TFLOP/s
PRIOR_OVERHEAD_S = (1e-4, (3e-5, 3e-4))  # fixed seconds per forward (launches, sampling), log-uniform range


def pair_name(pair: str) -> str:
    """Canonical pair name (aliases resolved); unknown pairs are a one-line error."""
    return models.pair_spec(pair).name


def pair_sizes(pair: str) -> tuple[ModelSize, ModelSize]:
    """(target, draft) sizes from the pair registry (models.PAIRS); a pair without them is a one-line error."""
    spec = models.pair_spec(pair)
    if spec.sizes is None:
        raise SpecdecError(f"no parameter counts for pair '{spec.name}'; add sizes to its entry in models.PAIRS")
    return spec.sizes


@dataclass(frozen=True)
class LinearCost:
    """Fitted forward time t = a + b*tokens + c*kv_tokens + d*[tokens > 1] + e*tokens*context: a [s],
    b [s/token], c [s/KV token] (reading the cache), d [s] a step penalty for any forward of more than one
    token, e [s per (new token, KV token) pair] (attention scores: each new token attends to its sequence's
    context, so verifying k+1 tokens costs k+1 times the attention of one). On CPUs torch runs a one-token
    forward as matrix-vector products and anything larger as GEMM, which here costs ~2x at 2 tokens
    (measured: data/raw/cpu/hardware); on GPUs the fit finds d ~ 0. The e term was chosen by leave-one-out
    cross-validation on the hardware forwards (cross_validate), not on the batch-study cells. d < 0 (fit_linear's
    free_step form): a one-token forward is the slower one; both engines' no-SD steps on the cpu batch study
    cost less at bs 4 than at bs 1 (medians 0.22 vs 0.26 s torch, 0.18 vs 0.24 s vLLM, 2026-12-06/07)."""

    a: float
    b: float
    c: float
    d: float = 0.0
    e: float = 0.0

    def seconds(self, batch, query, context):
        """Seconds for one forward: `batch` sequences, `query` new tokens each, `context` KV tokens each."""
        tokens = batch * query
        return (self.a + self.b * tokens + self.c * batch * context + self.d * (np.asarray(tokens) > 1)
                + self.e * tokens * np.asarray(context))


@dataclass(frozen=True)
class RooflineCost:
    """Roofline prior for one model: bytes and FLOPs per forward against spec-sheet bandwidth and peak."""

    weight_bytes: float
    kv_bytes_per_token: float
    params: float
    attn_flops_per_pair: float  # FLOPs per (query token, KV token) pair: 4 * layers * q_dim
    bw_bytes_s: float
    peak_flops_s: float
    eff_mem: float = PRIOR_EFF_MEM[0]
    eff_flops: float = PRIOR_EFF_FLOPS[0]
    overhead_s: float = PRIOR_OVERHEAD_S[0]
    weight_bw_bytes_s: float | None = None  # offloaded weights: read over the host link at this rate instead

    def seconds(self, batch, query, context):
        tokens = batch * query
        mem = (self.weight_bytes / (self.eff_mem * (self.weight_bw_bytes_s or self.bw_bytes_s))
               + self.kv_bytes_per_token * batch * context / (self.eff_mem * self.bw_bytes_s))
        flops = 2 * self.params * tokens + self.attn_flops_per_pair * tokens * context
        return self.overhead_s + np.maximum(mem, flops / (self.eff_flops * self.peak_flops_s))


@dataclass(frozen=True)
class DraftStepCost:
    """A whole draft step (all k proposals) as one fitted cost, as in the paper's simulator:
    t = fixed_s + per_spec_token_s * (k+1) + per_kv_token_s * batch*context  [s]."""

    fixed_s: float
    per_spec_token_s: float
    per_kv_token_s: float

    def step_seconds(self, batch, k: int, context):
        return self.fixed_s + self.per_spec_token_s * (k + 1) + self.per_kv_token_s * np.asarray(batch) * context


@dataclass
class Fit:
    """One model's least-squares fit: the points (medians), fitted seconds and relative residuals."""

    cost: LinearCost
    points: pd.DataFrame  # batch, query, context, tokens, kv_tokens, seconds, fitted_s, rel_resid
    free_step: bool = False  # the form fitted (fit_linear)

    def summary(self) -> dict:
        r = self.points["rel_resid"].to_numpy()
        err = self.points["seconds"] - self.points["fitted_s"]
        return {"n": len(r), "rmse_s": float(np.sqrt(np.mean(err ** 2))), "rel_rmse": float(np.sqrt(np.mean(r ** 2))),
                "max_abs_rel": float(np.max(np.abs(r)))}


FORMS = {"without attention term": 4, "with attention term": 5}  # columns of the design used


def _design(points: pd.DataFrame, columns: int = 5, free_step: bool = False) -> np.ndarray:
    """Columns of LinearCost's terms (a, b, c, d, e) for nnls. free_step: the first column is [tokens == 1]
    instead of 1, so a one-token forward and a longer one each get their own non-negative intercept (a, and d
    itself), and the step between them may have either sign (_cost maps back: d - a)."""
    t = points["tokens"]
    first = (t == 1) if free_step else np.ones(len(points))
    return np.column_stack([first, t, points["kv_tokens"], t > 1, t * points["context"]]).astype(float)[:, :columns]


def _cost(coef, free_step: bool = False) -> LinearCost:
    """LinearCost from _design's coefficients (missing trailing ones are 0)."""
    a, b, c, d, e = (list(map(float, coef)) + [0.0] * 5)[:5]
    return LinearCost(a, b, c, d - a if free_step else d, e)


def loo_rel_rmse(points: pd.DataFrame, columns: int = 5, free_step: bool = False) -> float:
    """Leave-one-out relative rmse of the fit (fraction): each point predicted by a fit to all the others."""
    X, y = _design(points, columns, free_step), points["seconds"].to_numpy(float)
    errs = []
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        errs.append(y[i] / (X[i] @ _nnls_relative(X[keep], y[keep])) - 1)
    return float(np.sqrt(np.mean(np.square(errs))))


def cross_validate(profile: str, pair: str | None = None) -> pd.DataFrame:
    """Leave-one-out relative rmse of each cost-model form, per model, on the profile's hardware forwards
    (the evidence for the e term): columns model, form, n, loo_rel_rmse (fraction)."""
    cm = fit(profile, pair)
    return pd.DataFrame([{"model": name, "form": form, "n": len(f.points),
                          "loo_rel_rmse": loo_rel_rmse(f.points, cols)}
                         for name, f in cm.fits.items() for form, cols in FORMS.items()])


def _nnls_relative(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    coef, _ = nnls(X / y[:, None], np.ones(len(y)))
    return coef


def fit_linear(forwards: pd.DataFrame, free_step: bool = False) -> Fit:
    """Fit t = a + b*tokens + c*batch*context + d*[tokens > 1] + e*tokens*context (all >= 0) to forwards
    rows of ONE model. free_step: d may be negative down to -a (a one-token forward slower than a longer one;
    _design), the form fit_steps may choose by leave-one-point-out error (_fit_form).

    Needs columns batch, query, context, seconds (tokens = batch*query); repeats are reduced to medians."""
    if forwards.empty:
        raise SpecdecError("no forward-pass measurements to fit")
    pts = forwards.groupby(["batch", "query", "context"], as_index=False)["seconds"].median()
    if len(pts) < 3:
        raise SpecdecError(f"need at least 3 distinct (batch, query, context) points to fit, got {len(pts)}")
    pts["tokens"] = pts["batch"] * pts["query"]
    pts["kv_tokens"] = pts["batch"] * pts["context"]
    y = pts["seconds"].to_numpy(float)
    if (y <= 0).any():
        raise SpecdecError("forward-pass times must be positive")
    cost = _cost(_nnls_relative(_design(pts, free_step=free_step), y), free_step)
    pts["fitted_s"] = cost.seconds(pts["batch"], pts["query"], pts["context"])
    pts["rel_resid"] = pts["seconds"] / pts["fitted_s"] - 1
    return Fit(cost, pts, free_step)


@dataclass
class CostModel:
    """Forward costs of a pair's target and draft on one profile; source is "fitted" or "prior"."""

    profile: str
    pair: str
    source: str
    target: object  # LinearCost | RooflineCost
    draft: object
    fits: dict = field(default_factory=dict)  # "target"/"draft" -> Fit (fitted only)
    overhead_s: float = 0.0  # extra seconds per decoding step, with or without SD (sampling, bookkeeping)
    ngram_fraction: float = 0.0  # n-gram proposal time as a fraction of the verify forward
    provenance: str = ""  # where published coefficients come from
    prefill_scale: float = 1.0  # a prefill costs this times a forward of its tokens (end-to-end calibration)
    # cross-validated structural error (fit_steps): rms log error of the no-SD/SD step-time ratio of calibration
    # cells each left out of the fit, and how many cells (0: not estimated). A diagnostic, not in the intervals:
    # with 1-4 calibration cells, leaving one out leaves the fit extrapolating (e.g. no bs-16 draft cell), and the
    # error it measures (71% on cpu, 122% on cpu-bf16, 2026-12-05) would make every interval uninformative
    cv_log_err: float = 0.0
    cv_n: int = 0
    # run-to-run noise (fit_steps, paired calibration cells): log sd of one cell's measured speedup about its
    # expectation, from the spread of its interleaved pairs (the machine's drift and contention between pairs),
    # pooled over the calibration cells and divided by sqrt(pairs per cell). The intervals (predict, validate)
    # multiply each replicate by exp(N(0, run_log_sd)): they are intervals for a measured cell, which is what
    # they are checked against. 0: not estimated (no paired calibration cells), no term.
    run_log_sd: float = 0.0

    def run_noise(self, rng: np.random.Generator) -> float:
        """One draw of a measured cell's speedup over its expectation (factor, 1.0 when run_log_sd is 0; no
        random number is drawn then, so intervals without the term are unchanged)."""
        return float(np.exp(rng.normal(0.0, self.run_log_sd))) if self.run_log_sd > 0 else 1.0

    def forward_s(self, model: str, batch, query, context):
        """Seconds for one forward of "target" or "draft"."""
        return getattr(self, model).seconds(batch, query, context)

    def draft_s(self, batch, k: int, context, proposer: str = "draft", verify=None):
        """Seconds to propose k tokens per sequence. A draft model or EAGLE head: its step cost if published
        as one (DraftStepCost), else k forwards (the first of 2 tokens per sequence, then k-1 of 1). An n-gram
        lookup: ngram_fraction of the verify forward (0 unless published)."""
        if k <= 0:
            return 0.0
        kind = PROPOSERS[proposer].cost if proposer in PROPOSERS else None
        if kind == "lookup":
            if verify is None:
                verify = self.forward_s("target", batch, k + 1, context)
            return self.ngram_fraction * verify
        if kind != "draft forward":
            raise SpecdecError(f"unknown proposer '{proposer}'; known: "
                               f"{', '.join(n for n, p in PROPOSERS.items() if p.cost != 'none')}")
        if isinstance(self.draft, DraftStepCost):
            return self.draft.step_seconds(batch, k, context)
        if self.draft is None:
            raise SpecdecError(f"costs for {self.pair} on {self.profile} have no draft model")
        return self.forward_s("draft", batch, 2, context) + (k - 1) * self.forward_s("draft", batch, 1, context)

    def step_parts(self, batch, k: int, context, proposer: str = "draft", width=None) -> tuple:
        """(draft, verify, overhead) seconds of one decoding step of `batch` sequences with `context` KV tokens
        each. k = 0: no proposal and one target forward of 1 token per sequence. k >= 1: the proposer's time
        (draft_s) and the target verifying `width` tokens per sequence (default k+1; an n-gram lookup that
        proposes fewer is verified at its mean width: AcceptanceModel.verify_width). overhead_s either way."""
        verify = self.forward_s("target", batch, (k + 1) if width is None or k <= 0 else width, context)
        return self.draft_s(batch, k, context, proposer, verify), verify, self.overhead_s

    def step_s(self, batch, k: int, context, proposer: str = "draft", width=None):
        """Seconds for one decoding step: the sum of step_parts."""
        draft, verify, overhead = self.step_parts(batch, k, context, proposer, width)
        return draft + verify + overhead

    def draft_share(self, batch, k: int, context, proposer: str = "draft", width=None):
        """Fraction of a step's seconds spent proposing."""
        draft, verify, overhead = self.step_parts(batch, k, context, proposer, width)
        return draft / (draft + verify + overhead)

    def residuals(self) -> dict:
        """Per model: n points, rmse_s [s], rel_rmse and max_abs_rel (fractions); empty for the prior."""
        return {name: f.summary() for name, f in self.fits.items()}

    def describe(self) -> str:
        if self.source == "published":
            return f"PUBLISHED coefficients ({self.provenance or 'no provenance given'}), not fitted here"
        if self.source == "steps":
            res = self.residuals()
            cv = (f"; step-ratio error cross-validated over {self.cv_n} left-out calibration cell(s) "
                  f"{self.cv_log_err:.1%} (log rms)" if self.cv_n else "; no cross-validated error (too few cells)")
            noise = f"; run-to-run noise {self.run_log_sd:.1%} (log sd per cell)" if self.run_log_sd > 0 else ""
            return (f"FITTED END TO END on {self.provenance} (rel. rmse target {res['target']['rel_rmse']:.1%} over "
                    f"{res['target']['n']} points, draft {res['draft']['rel_rmse']:.1%}{cv}{noise})")
        if self.source == "prior":
            t = self.target
            return (f"PRIOR (roofline from the {self.profile} spec sheet, eff_mem {t.eff_mem:g}, "
                    f"eff_flops {t.eff_flops:g}, {t.overhead_s * 1e6:g} us/forward), not measured")
        res = self.residuals()
        if "target" not in res or "draft" not in res:
            return f"FITTED coefficients for {self.pair} on {self.profile} (fit residuals not available)"
        return (f"FITTED on data/raw/{self.profile}/hardware (rel. rmse target {res['target']['rel_rmse']:.1%} "
                f"over {res['target']['n']} points, draft {res['draft']['rel_rmse']:.1%})")

    def resample(self, rng: np.random.Generator) -> "CostModel":
        """One bootstrap replicate: refit on fitted values times resampled (1 + relative residuals), or
        for the prior, efficiencies and overhead drawn from their ranges (shared by target and draft)."""
        if self.source.startswith("published") or not (self.fits or isinstance(self.target, RooflineCost)):
            return self
        if self.source in ("fitted", "steps"):
            if not self.fits:  # coefficients given, not fitted here: nothing to resample
                return self
            new = {}
            for name, f in self.fits.items():
                pts = f.points
                r = rng.choice(pts["rel_resid"].to_numpy(), size=len(pts), replace=True)
                y = pts["fitted_s"].to_numpy() * (1 + r)
                new[name] = _cost(_nnls_relative(_design(pts, free_step=f.free_step), y), f.free_step)
            return replace(self, target=new["target"], draft=new["draft"])
        lo, hi = PRIOR_OVERHEAD_S[1]
        kw = {"eff_mem": rng.uniform(*PRIOR_EFF_MEM[1]), "eff_flops": rng.uniform(*PRIOR_EFF_FLOPS[1]),
              "overhead_s": float(np.exp(rng.uniform(np.log(lo), np.log(hi))))}
        return replace(self, target=replace(self.target, **kw), draft=replace(self.draft, **kw))


def fit(profile: str, pair: str | None = None, forwards: pd.DataFrame | None = None) -> CostModel:
    """Fitted costs from data/raw/<profile>/hardware (forwards table), or from `forwards` if given.

    `pair` selects the measured pair (default: the only one present); no data is a one-line error."""
    hardware.load_profile(profile)
    if forwards is None:
        forwards = tables.load(profile, "hardware", "forwards")
    if pair is not None:
        pair = pair_name(pair)
    if pair is not None and "pair" in forwards:
        name = pair
        found = sorted(forwards["pair"].dropna().unique())
        forwards = forwards[forwards["pair"] == name]
        if forwards.empty:
            raise SpecdecError(f"no forward measurements of pair '{name}' in data/raw/{profile}/hardware "
                               f"(measured: {', '.join(found) or 'none'})")
    elif "pair" in forwards:
        found = forwards["pair"].dropna().unique()
        if len(found) > 1:
            raise SpecdecError(f"data/raw/{profile}/hardware holds several pairs ({', '.join(found)}); name one")
        pair = found[0] if len(found) else "unknown"
    fits = {}
    for name in ("target", "draft"):
        rows = forwards[forwards["model"] == name]
        if rows.empty:
            raise SpecdecError(f"no '{name}' forward measurements in data/raw/{profile}/hardware")
        fits[name] = fit_linear(rows)
    return CostModel(profile, pair or "unknown", "fitted", fits["target"].cost, fits["draft"].cost, fits)


def matches(run_id: str, patterns) -> bool:
    """Whether a run id matches one of the shell patterns (a calibration cell)."""
    import fnmatch
    return any(fnmatch.fnmatch(run_id, p) for p in patterns)


def fit_steps(profile: str, calibration, pair: str | None = None, engine: str = "torch",
              cross_validate: bool = True, drift: bool | None = None, free_step: bool | None = None) -> CostModel:
    """Costs fitted on the batch study's own decoding steps (end to end, as the paper's simulator fits profiled
    step times) instead of forward microbenchmarks: the target from every no-SD batch (its k=0 cells, or the
    interleaved no-SD arm of paired cells: seconds per step, 1 token) and from the verify + bookkeeping seconds
    of the SD cells named in `calibration` (run-id shell patterns; k+1 tokens); the draft model from those
    cells' draft seconds per proposed token; the n-gram lookup's share of the verify forward likewise. Context:
    the cell's padded prompt width plus half its output. Cells not named stay out of the fit (held out).

    With `cross_validate`, the model's own structural error is estimated inside the calibration set: each
    calibration cell in turn is left out (both its arms), the costs refitted on the rest, and the left-out cell's
    no-SD / SD step-time ratio predicted; `cv_log_err` is the rms of log(predicted / measured) over those cells
    and `cv_n` their number (cells whose refit is impossible, e.g. the only draft-model cell, are skipped).

    `drift`: whether a paired calibration cell's SD seconds are first scaled by its own no-SD arm, so that a cell
    measured in a slow (or fast) moment of a drifting machine does not bend the fit: scale = the no-SD fit's
    seconds per step for the base arm's batches / the base arm's measured seconds per step. None (the default)
    fits both ways and keeps the one with the lower cross-validated error (a tie, or no cross-validation:
    unscaled); the choice and both errors go into `provenance`. `free_step`: whether the target's fit may make a
    one-token forward dearer than a longer one (fit_linear; on the cpu profile both engines' no-SD steps cost
    less at bs 4 than at bs 1); None chooses it by the target fit's leave-one-point-out error (_fit_form).
    The cross-validation over calibration cells above cannot choose it: with 3-4 cells, each left out leaves
    the fit extrapolating, and those errors (65-85% log rms on cpu) swamp a form's effect on the bs-1 steps."""
    b = tables.load(profile, "batch", "batches")
    st = tables.load(profile, "batch", "steps")
    rq = tables.load(profile, "batch", "requests")
    b, st, rq = (x[x["engine"] == engine] for x in (b, st, rq))
    runs = tables.runs(profile, "batch")
    pair = pair_name(pair) if pair else str(b["pair"].iloc[0])
    noise = run_log_sd(b[(b["pair"] == pair) & b["run_id"].map(lambda r: matches(r, calibration))])
    if engine == "vllm":  # no per-step rows: steps and the step split from vLLM's per-call figures
        b = decode_steps(b)
        st = vllm_step_rows(b)
    st = with_widths(st, b, runs, engine)
    b, st, rq = (x[x["pair"] == pair] for x in (b, st, rq))
    ways = [False, True] if drift is None and cross_validate else [bool(drift)]
    fits = []
    for scaled in ways:
        costs = _fit_form(profile, calibration, pair, b, st, rq, scaled, free_step)
        if cross_validate:
            form = costs.fits["target"].free_step
            errs = [e for e in (_left_out_error(profile, calibration, pair, b, st, rq, rid, scaled, form)
                                for rid in sorted(st.loc[_named(st, calibration), "run_id"].unique()))
                    if e is not None]
            if errs:
                costs = replace(costs, cv_log_err=float(np.sqrt(np.mean(np.square(errs)))), cv_n=len(errs))
        fits.append(replace(costs, run_log_sd=noise))
    if len(fits) == 1:
        return fits[0]
    plain, scaled = fits
    if plain.cv_n and scaled.cv_n and scaled.cv_log_err < plain.cv_log_err - 1e-9:
        return replace(scaled, provenance=scaled.provenance + f"; calibration cells scaled by their no-SD arm "
                       f"(drift), chosen by cross-validation ({scaled.cv_log_err:.1%} against {plain.cv_log_err:.1%})")
    if plain.cv_n and scaled.cv_n:
        return replace(plain, provenance=plain.provenance + f"; calibration cells unscaled, chosen by "
                       f"cross-validation ({plain.cv_log_err:.1%} against {scaled.cv_log_err:.1%} scaled)")
    return plain


def run_log_sd(b: pd.DataFrame) -> float:
    """Log sd of one paired cell's measured speedup about its expectation, from batches `b` (rows of paired
    runs: arm cell/base, pair_idx, decode_tokens, decode_s): per pair, log(cell tok/s / base tok/s); the
    deviations from each run's mean are pooled over runs (sum of squares / sum of (pairs - 1)), and the pooled
    sd divided by sqrt(the median pairs per run), as a cell's speedup averages its pairs. 0.0 when no run has
    two pairs (unpaired runs are skipped)."""
    if not {"arm", "pair_idx"} <= set(b.columns):  # unpaired tables
        return 0.0
    dev, dof, sizes = 0.0, 0, []
    for _, g in b.groupby("run_id"):
        both = tables.pair_sums(g)
        if len(both) < 2:
            continue
        x = np.log((both["decode_tokens_c"] / both["decode_s_c"]) / (both["decode_tokens_b"] / both["decode_s_b"]))
        dev += float(np.square(x - x.mean()).sum())
        dof += len(x) - 1
        sizes.append(len(x))
    return float(np.sqrt(dev / dof / np.median(sizes))) if dof else 0.0


def _fit_form(profile, calibration, pair, b, st, rq, drift: bool, free_step: bool | None) -> CostModel:
    """_fit_steps with the target's form given, or (free_step None) chosen by the leave-one-point-out relative
    error of the target fit (loo_rel_rmse), as the e term is chosen on the hardware forwards: whether a one-token
    forward may cost more than a longer one is a property of the forward cost, read off its points. A tie keeps
    the step >= 0. The choice and both errors go into `provenance`."""
    if free_step is not None:
        return _fit_steps(profile, calibration, pair, b, st, rq, drift, bool(free_step))
    both = {f: _fit_steps(profile, calibration, pair, b, st, rq, drift, f) for f in (False, True)}
    loo = {f: loo_rel_rmse(c.fits["target"].points, 5, f) for f, c in both.items()}
    if loo[True] < loo[False] - 1e-9:
        c, why = both[True], (f"one-token step free, chosen by leave-one-point-out error ({loo[True]:.1%} "
                              f"against {loo[False]:.1%})")
    else:
        c, why = both[False], (f"step at more than one token kept >= 0 (leave-one-point-out error "
                               f"{loo[False]:.1%}, {loo[True]:.1%} if free)")
    return replace(c, provenance=f"{c.provenance}; target: {why}")


def decode_steps(b: pd.DataFrame) -> pd.DataFrame:
    """vLLM's batch rows with `steps` (decode steps per generate call) where vLLM left it NaN: a no-SD call's
    decode tokens per sequence (one token per step); an SD call's engine steps (vllm_steps.py, in-process
    engines only) less the prefill steps of the paired no-SD call on the same prompts (its engine steps less its
    decode steps). Unpaired SD calls, or calls without engine_steps, keep NaN."""
    b = b.copy()
    if "engine_steps" not in b:
        return b
    nosd = (b["arm"] == "base") | (b["k"] == 0)
    missing = b["steps"].isna()
    b.loc[nosd & missing, "steps"] = (b["decode_tokens"] / b["size"])[nosd & missing]
    key = ["run_id", "repeat", "batch_idx"]
    prefill = (b.loc[nosd, key].assign(prefill_steps=b["engine_steps"] - b["steps"]))
    sd = ~nosd & missing
    if sd.any():
        merged = b.loc[sd, key].merge(prefill, on=key, how="left")
        b.loc[sd, "steps"] = (b.loc[sd, "engine_steps"].to_numpy() - merged["prefill_steps"].to_numpy())
    return b


def vllm_step_rows(b: pd.DataFrame) -> pd.DataFrame:
    """One steps-table-like row per vLLM SD call (what fit_steps reads of the torch engine's steps): its mean
    decode step, decode_s / steps seconds, split into draft_s and verify_s in the proportions of the call's own
    step split (draft_s / step_s over all its steps, prefill included, so the draft share is a little low);
    other_s = 0 (inside verify_s). Needs decode_steps' `steps`; calls without a split are left out."""
    cols = ["run_id", "repeat", "batch_idx", "pair", "k", "proposer", "batch", "verify_s", "other_s", "draft_s"]
    if "step_s" not in b:
        return pd.DataFrame(columns=cols)
    sd = b[(b["arm"] == "cell") & (b["k"] > 0) & (b["steps"] > 0) & (b["step_s"] > 0)]
    per_step = sd["decode_s"] / sd["steps"]
    share = sd["draft_s"] / sd["step_s"]
    out = sd[cols[:7]].assign(verify_s=per_step * (1 - share), other_s=0.0, draft_s=per_step * share)
    return out.reset_index(drop=True)


def step_widths(st: pd.DataFrame, verify: dict) -> pd.Series:
    """Tokens per sequence each step's target forward verified (steps-table rows; `verify`: run_id -> the run's
    rule, tables.runs' `verify`): k+1 under "k" (and where the rule or the step's proposals are unknown), 1 +
    the batch's longest proposal under "proposed", 1 + its mean proposal under "ragged" (the rows the target
    multiplies, per sequence); 1 at k = 0. A draft model proposes k: k+1 every way."""
    out = (st["k"] + 1).astype(float)
    for i, (rid, k, prop) in enumerate(zip(st["run_id"], st["k"], st["proposed"])):
        rule = verify.get(rid, "k")
        if k <= 0 or rule == "k" or prop is None or not len(prop):
            continue
        c = np.minimum(np.asarray(prop, dtype=float), k)
        out.iloc[i] = 1.0 + (c.mean() if rule == "ragged" else c.max())
    return out


def with_widths(st: pd.DataFrame, b: pd.DataFrame, runs: pd.DataFrame, engine: str) -> pd.DataFrame:
    """Steps rows `st` with a `width` column: tokens per sequence each step's target forward verified. vLLM
    (steps from vllm_step_rows): its run's mean from the spec-decode counters (vllm_widths; k+1 where a run has
    none); torch: step_widths under the run's verify rule (tables.runs `verify`). `b`: the batches rows (vLLM
    only; decode_steps applied)."""
    if engine == "vllm":
        w = vllm_widths(b, runs)
        return st.assign(width=[w.get(r, k + 1.0) for r, k in zip(st["run_id"], st["k"])])
    return st.assign(width=step_widths(st, dict(zip(runs["run_id"], runs["verify"]))))


def measured_widths(st: pd.DataFrame, b: pd.DataFrame, runs: pd.DataFrame, engine: str) -> dict:
    """Per run id: the mean verify width (tokens per sequence) of its SD steps, where it was measured: a vLLM
    run with spec-decode counters (vllm_widths), a torch run with per-step rows (with_widths over `st`, the
    steps table; other engines' rows are skipped). Runs without either are left out."""
    if engine == "vllm":
        return vllm_widths(b, runs)
    sd = st[(st["engine"] == engine) & (st["k"] > 0)]
    return with_widths(sd, b, runs, engine).groupby("run_id")["width"].mean().to_dict() if len(sd) else {}


def vllm_widths(b: pd.DataFrame, runs: pd.DataFrame) -> dict:
    """Per vLLM run id: mean tokens per sequence its SD steps verified, 1 + drafted tokens / request-steps, from
    the run's spec-decode counters over its timed calls (tables.runs: drafts, drafted_tokens, accepted_tokens;
    vLLM verifies each request's own proposal, and an n-gram lookup that finds nothing proposes none). A
    request-step emits 1 + its accepted tokens, so request-steps >= decode tokens of the SD arm - accepted tokens
    (fewer where a last step's accepted tokens ran past max_tokens and were dropped) and >= drafts (the steps
    that proposed: all of them for a draft model); the larger of the two is taken. Runs without counters are
    left out (k+1 then)."""
    out = {}
    if "drafted_tokens" not in runs:
        return out
    cell = b[(b["arm"] == "cell") & (b["k"] > 0)].groupby("run_id")["decode_tokens"].sum()
    for r in runs[runs["drafted_tokens"].notna()].itertuples():
        steps = max(cell.get(r.run_id, np.nan) - r.accepted_tokens, getattr(r, "drafts", 0.0) or 0.0)
        if np.isfinite(steps) and steps > 0:
            out[r.run_id] = 1.0 + float(r.drafted_tokens) / float(steps)
    return out


def _named(st: pd.DataFrame, calibration) -> pd.Series:
    """Rows of SD steps of the calibration cells."""
    return (st["k"] > 0) & st["run_id"].map(lambda r: matches(r, calibration))


def _contexts(rq: pd.DataFrame) -> dict:
    """KV columns per sequence of each timed batch (run_id, repeat, batch_idx): padded prompt width plus half
    the output."""
    return {key: float(g["prompt_tokens"].max() + g["new_tokens"].mean() / 2)
            for key, g in rq.groupby(["run_id", "repeat", "batch_idx"])}


def _drift_scales(no_sd: LinearCost, base: pd.DataFrame, ctx: dict, run_ids) -> dict:
    """Per paired run id: the no-SD fit's seconds per step for its base arm's batches / the measured ones
    (1 where the run has no base arm). A cell measured while the machine ran 1.5x slow gets ~0.67."""
    out = {}
    for rid in run_ids:
        arm = base[(base["run_id"] == rid) & (base["arm"] == "base") & (base["steps"] > 0)]
        c = [ctx.get((r.run_id, r.repeat, r.batch_idx), np.nan) for r in arm.itertuples()]
        per_step = np.asarray(no_sd.seconds(arm["size"].to_numpy(float), 1, np.asarray(c, float)))
        predicted, measured = per_step * arm["steps"].to_numpy(float), arm["decode_s"].to_numpy(float)
        ok = np.isfinite(predicted)
        out[rid] = float(predicted[ok].sum() / measured[ok].sum()) if ok.any() and measured[ok].sum() > 0 else 1.0
    return out


def _fit_steps(profile, calibration, pair, b, st, rq, drift: bool = False, free_step: bool = False) -> CostModel:
    ctx = _contexts(rq)
    base = b[(b["arm"] == "base") | (b["k"] == 0)]
    tgt = [{"batch": r.size, "query": 1, "context": ctx.get((r.run_id, r.repeat, r.batch_idx), np.nan),
            "seconds": r.decode_s / r.steps} for r in base.itertuples() if r.steps > 0]
    cal = st[_named(st, calibration)]
    scale = (_drift_scales(fit_linear(pd.DataFrame(tgt).dropna(), free_step).cost, base, ctx, cal["run_id"].unique())
             if drift and cal.size else {})
    draft, ngram = [], []
    if "width" not in cal:
        cal = cal.assign(width=cal["k"] + 1)
    for (rid, rep, bi, k, prop, bs), g in cal.groupby(["run_id", "repeat", "batch_idx", "k", "proposer", "batch"]):
        c, f = ctx.get((rid, rep, bi), np.nan), scale.get(rid, 1.0)
        # verify widths that vary (an n-gram lookup proposing fewer than k): at bs 1 one point per width (a
        # 1-token step has no multi-row cost), above it the mean step at the mean width (the cost is linear in
        # the rows); a constant width: the median step, robust to a stray slow one. A bs-1 step that proposed
        # nothing is a plain decode step, which the cell's own no-SD arm measures unscaled: left out here
        parts = [g] if bs > 1 or g["width"].nunique() == 1 else [x for w, x in g.groupby("width") if w > 1]
        for part in parts:
            sec, w = part["verify_s"] + part["other_s"], part["width"]
            one = w.nunique() == 1
            tgt.append({"batch": bs, "query": float(w.iloc[0]) if one else float(w.mean()), "context": c,
                        "seconds": f * float(sec.median() if one else sec.mean())})
        if prop == "draft":
            draft.append({"batch": bs, "query": 1, "context": c, "seconds": f * float(g["draft_s"].median()) / k})
        elif prop == "ngram":
            ngram.append(float((g["draft_s"] / g["verify_s"]).median()))
    tgt = pd.DataFrame(tgt).dropna()
    if not draft:
        raise SpecdecError(f"no draft-model calibration cell among {list(calibration)} on {profile}")
    ft, fd = fit_linear(tgt, free_step), fit_linear(pd.DataFrame(draft).dropna())
    return CostModel(profile, pair, "steps", ft.cost, fd.cost, {"target": ft, "draft": fd},
                     ngram_fraction=float(np.median(ngram)) if ngram else 0.0,
                     provenance=f"batch-study steps of data/raw/{profile}/batch: no-SD batches + "
                                f"{cal['run_id'].nunique()} calibration cell(s) ({', '.join(calibration)})")


def _left_out_error(profile, calibration, pair, b, st, rq, run_id, drift: bool = False,
                    free_step: bool = False) -> float | None:
    """log(predicted / measured) no-SD-to-SD step-time ratio of calibration cell `run_id`, its costs refitted
    without it; None where the refit or the cell's no-SD reference is missing."""
    cell = b[(b["run_id"] == run_id) & (b["arm"] == "cell")]
    base = b[(b["run_id"] == run_id) & (b["arm"] == "base")]
    if base.empty and not cell.empty:  # unpaired: the k=0 cells of the same batch size
        base = b[(b["k"] == 0) & (b["arm"] == "cell") & (b["batch"] == cell["batch"].iloc[0])]
    if cell.empty or base.empty or (cell["steps"] <= 0).all() or (base["steps"] <= 0).all():
        return None
    keep = [x[x["run_id"] != run_id] for x in (b, st, rq)]
    try:
        costs = _fit_steps(profile, calibration, pair, *keep, drift, free_step)
    except SpecdecError:
        return None
    c = cell.iloc[0]
    context = float(np.mean(list(_contexts(rq[rq["run_id"] == run_id]).values())))
    own = st.loc[(st["run_id"] == run_id) & (st["k"] > 0), "width"] if "width" in st else pd.Series(dtype=float)
    widths = own.to_numpy(float) if len(own) else None  # the cell's own verify widths (k+1 for a draft model)
    sd = float(np.mean(costs.step_s(int(c["batch"]), int(c["k"]), context, str(c["proposer"]), widths)))
    predicted = costs.step_s(int(c["batch"]), 0, context) / sd
    measured = (base["decode_s"].sum() / base["steps"].sum()) / (cell["decode_s"].sum() / cell["steps"].sum())
    return float(np.log(predicted / measured))


def prior(profile: str, pair: str, bytes_per_param: float | None = None) -> CostModel:
    """Roofline prior from the profile's spec sheet; bytes/param defaults to 2 (bf16) on a GPU, 4 (fp32) else."""
    hw = hardware.load_profile(profile)
    target, draft = pair_sizes(pair)
    bw, peak = hw.get("mem_bw_tbs"), hw.get("peak_tflops")
    if not bw or not peak:
        raise SpecdecError(f"profile '{profile}' has no spec sheet (peak_tflops, mem_bw_tbs) for a roofline prior")
    nbytes = bytes_per_param or (2 if hw.get("kind") == "gpu" else 4)

    def roof(m: ModelSize, link=None) -> RooflineCost:
        return RooflineCost(m.params * nbytes, m.kv_elems_per_token * nbytes, m.params, 4 * m.layers * m.q_dim,
                            bw * 1e12, peak * 1e12, weight_bw_bytes_s=link * 1e12 if link else None)

    # offload_link_tbs: the target's weights stream over the host link every forward; the draft is resident
    return CostModel(profile, pair_name(pair), "prior", roof(target, hw.get("offload_link_tbs")), roof(draft))


TARGET_KEYS = {"fixed_s", "per_token_s", "per_kv_token_s"}
DRAFT_KEYS = {"fixed_s", "per_spec_token_s", "per_kv_token_s"}
ENTRY_KEYS = {"source", "target", "draft", "ngram_draft_fraction", "step_overhead_s"}


def _num(entry: dict, key: str, where: str) -> float:
    v = entry.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
        raise SpecdecError(f"{where}.{key} must be a number >= 0, got {v!r}")
    return float(v)


def published(profile: str, pair: str) -> CostModel:
    """Costs given in configs/hardware/<profile>.yaml under `costs: {<pair>: {...}}` (no Python needed).

    Keys: source (provenance text), target {fixed_s, per_token_s, per_kv_token_s}, draft {fixed_s,
    per_spec_token_s, per_kv_token_s} (a whole draft step) or {fixed_s, per_token_s, per_kv_token_s} (one
    draft forward), ngram_draft_fraction, step_overhead_s. Bad or missing entries are one-line errors."""
    hw = hardware.load_profile(profile)
    name = pair_name(pair)
    entry = (hw.get("costs") or {}).get(name)
    where = f"configs/hardware/{profile}.yaml costs.{name}"
    if entry is None:
        raise SpecdecError(f"profile '{profile}' publishes no costs for {name}")
    if not isinstance(entry, dict) or set(entry) - ENTRY_KEYS or not isinstance(entry.get("target"), dict):
        raise SpecdecError(f"{where} needs a mapping with 'target' (and optionally {', '.join(sorted(ENTRY_KEYS - {'target'}))})")
    t = entry["target"]
    if set(t) != TARGET_KEYS:
        raise SpecdecError(f"{where}.target needs exactly {', '.join(sorted(TARGET_KEYS))}")
    target = LinearCost(_num(t, "fixed_s", where + ".target"), _num(t, "per_token_s", where + ".target"),
                        _num(t, "per_kv_token_s", where + ".target"))
    d, draft = entry.get("draft"), None
    if isinstance(d, dict) and set(d) == DRAFT_KEYS:
        draft = DraftStepCost(*(_num(d, key, where + ".draft") for key in ("fixed_s", "per_spec_token_s", "per_kv_token_s")))
    elif isinstance(d, dict) and set(d) == TARGET_KEYS:
        draft = LinearCost(*(_num(d, key, where + ".draft") for key in ("fixed_s", "per_token_s", "per_kv_token_s")))
    elif d is not None:
        raise SpecdecError(f"{where}.draft needs {', '.join(sorted(DRAFT_KEYS))} (a draft step) or "
                           f"{', '.join(sorted(TARGET_KEYS))} (one draft forward)")
    return CostModel(profile, name, "published", target, draft,
                     overhead_s=_num(entry, "step_overhead_s", where) if "step_overhead_s" in entry else 0.0,
                     ngram_fraction=_num(entry, "ngram_draft_fraction", where) if "ngram_draft_fraction" in entry else 0.0,
                     provenance=str(entry.get("source", "")))


def load(profile: str, pair: str) -> CostModel:
    """The best cost source for this pair on this profile: fitted end to end on the batch study's steps where its
    config names calibration cells (fit_steps), else fitted on data/raw/<profile>/hardware, else
    coefficients published in the profile yaml, else the roofline prior, else a one-line error."""
    hardware.load_profile(profile)
    name = pair_name(pair)
    errors = []
    try:  # end to end on the batch study's steps, where its config names calibration cells
        from ..data import config as cfgmod
        cal = cfgmod.analysis_settings("batch", profile)["calibration"]
        if cal and tables.has_runs(profile, "batch"):
            return fit_steps(profile, cal, name)
    except SpecdecError as e:
        errors.append(str(e))
    for source in (fit, published, prior):
        try:
            return source(profile, name)
        except SpecdecError as e:
            errors.append(str(e))
    raise SpecdecError(f"no costs for {name} on {profile}: {'; '.join(errors)}")


# Points at which fitted, published and prior target costs are compared (batch, query, context).
COMPARE_AT = ((1, 1, 1024), (1, 4, 1024), (8, 4, 1024), (32, 4, 1024), (128, 1, 1024), (128, 4, 1024))


def compare_target(profile: str) -> pd.DataFrame:
    """The target forward cost fitted on `profile`'s hardware study beside every published fit of a target of
    the same shape (another profile's yaml `costs`, e.g. the paper's H100 fit of Llama-3.1-8B) and beside
    `profile`'s roofline prior. One row per (source, point): source, profile, pair, fixed_s, per_token_s,
    per_kv_token_s (the three coefficients both forms share; the fit's d and e terms are in `extra_s`, seconds
    they add at that point), batch, query, context, seconds, and ratio = seconds / the fitted seconds."""
    fitted = fit(profile)
    shape = models.target_shape(fitted.pair)
    rows = [("fitted", profile, fitted.pair, fitted.target)]
    for other in hardware.profile_names():
        for name in (hardware.load_profile(other).get("costs") or {}):
            if models.target_shape(name) == shape:
                rows.append(("published", other, name, published(other, name).target))
    try:
        rows.append(("prior", profile, fitted.pair, prior(profile, fitted.pair).target))
    except SpecdecError:
        pass
    out = []
    for source, prof, pair, cost in rows:
        coef = ({"fixed_s": cost.a, "per_token_s": cost.b, "per_kv_token_s": cost.c}
                if isinstance(cost, LinearCost) else {"fixed_s": cost.overhead_s, "per_token_s": np.nan,
                                                       "per_kv_token_s": np.nan})
        for b, q, c in COMPARE_AT:
            sec = float(cost.seconds(b, q, c))
            extra = float(cost.d * (b * q > 1) + cost.e * b * q * c) if isinstance(cost, LinearCost) else np.nan
            out.append({"source": source, "profile": prof, "pair": pair, **coef, "extra_s": extra, "batch": b,
                        "query": q, "context": c, "seconds": sec,
                        "ratio": sec / float(fitted.target.seconds(b, q, c))})
    return pd.DataFrame(out)
