"""The claims verdict table: each hypothesis from "Speculative Decoding: Performance or Illusion?"
(arXiv 2601.11580) and its summary, checked against OUR measurements of one hardware profile.

Every number comes from data/raw through `analysis`; nothing is hard-coded except the claimed values and
the tolerance rules below. Verdicts: "reproduced", "not reproduced", "not measurable here" (with the
reason: no EAGLE runs, no batch size above the threshold, only one profile, ...).

Decision rules (also written into the table's `rule` column):
  * "X-fold" claims: reproduced when our point estimate lies within +-REL_TOL (relative) of X.
  * Threshold claims ("< 1.1x", "between 0.8 and 1.0"): every qualifying cell's point estimate must
    satisfy the inequality; the reported number is the deciding (worst) cell.
  * "~a" acceptance claims: within +-ALPHA_TOL (absolute) at every measured batch size.
  * "higher on H100 than A100": the mean paired difference of draft-overhead shares is > 0.
  * "often as good as": an alternative reaches >= AS_GOOD x the best SD speedup in >= OFTEN of the settings.
The verdict is decided on the point estimate; the 95% bootstrap CI is reported next to it and the reason
notes when the CI crosses the decision boundary.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..data import traces as tr
from ..errors import SpecdecError
from ..model import costmodel
from . import analysis, views

REL_TOL = 0.10
ALPHA_TOL = 0.10
AS_GOOD = 0.95
OFTEN = 0.5
LARGE_TARGET_B = 30.0  # targets with >= 30B parameters are "large" (the paper: 8B small, 70B/106B large)

REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE = "reproduced", "not reproduced", "not measurable here"

CLAIMS = {
    "C1": ("EAGLE speeds decoding up to 1.96x at batch size 1", "vLLM, H100, k=3"),
    "C2": ("EAGLE speedup is 1.21x at batch size 128", "vLLM, H100"),
    "C3": ("SD gives up to 2.5x speedup at batch size 1", "summary of the paper"),
    "C4": ("SD speedup is below 1.1x above batch size 8", "summary of the paper"),
    "C5": ("SD slows decoding by up to 20% above batch size 32 (speedup in [0.8, 1.0])", "summary of the paper"),
    "C6a": ("break-even acceptance is ~0.7 for small models", "summary of the paper"),
    "C6b": ("break-even acceptance is ~0.9 for large models", "summary of the paper"),
    "C7": ("relative draft overhead is higher on H100 than on A100", "summary of the paper"),
    "C8": ("continuous batching or quantization is often as good as SD", "summary of the paper"),
    "C8s": ("continuous batching or quantization is often as good as SD",
            "summary of the paper; here: vLLM's server, continuous batching without SD vs with SD, Poisson load"),
}
COLUMNS = ["claim", "statement", "paper_setting", "profile", "basis", "rule", "measured", "ci_lo", "ci_hi",
           "measured_text", "verdict", "reason", "torch_engine"]
SPEEDUP_CLAIMS = ("C1", "C2", "C3", "C4", "C5")  # decided on batch-study speedups: by vLLM where it measured
# which study's data decides each claim (its views.mode gives the basis: measured or predicted)
CLAIM_STUDY = {"C1": "batch", "C2": "batch", "C3": "batch", "C4": "batch", "C5": "batch", "C6a": "acceptance",
               "C6b": "acceptance", "C7": "hardware", "C8": "alternatives",
               "C8s": "serving"}


def _band(x: float) -> tuple[float, float]:
    return x * (1 - REL_TOL), x * (1 + REL_TOL)


def _row(cid, rule, verdict, reason, measured=np.nan, lo=np.nan, hi=np.nan, text=None):
    return {"claim": cid, "statement": CLAIMS[cid][0], "paper_setting": CLAIMS[cid][1], "rule": rule,
            "measured": measured, "ci_lo": lo, "ci_hi": hi,
            "measured_text": text if text is not None else analysis.fmt_ci(measured, lo, hi),
            "verdict": verdict, "reason": reason}


def _crosses(lo, hi, lower=-np.inf, upper=np.inf) -> str:
    """A note when the CI [lo, hi] crosses a boundary of [lower, upper]."""
    if np.isnan(lo) or np.isnan(hi):
        return "; no CI (too few timed batches)"
    if (lo < lower <= hi) or (lo <= upper < hi):
        return "; the 95% CI crosses the boundary"
    return ""


def target_billions(pair: str | None) -> float | None:
    """Target size in billions of parameters parsed from a pair name ('qwen2.5-coder-1.5b/0.5b' -> 1.5)."""
    if not pair:
        return None
    m = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)b\b", pair.split("/")[0].lower())
    return float(m.group(1)) if m else None


def _is_large(pair: str | None) -> bool:
    size = target_billions(pair)
    return size is not None and size >= LARGE_TARGET_B


def _is_eagle(df: pd.DataFrame) -> pd.Series:
    """EAGLE cells: an eagle proposer, or a pair whose draft is an EAGLE head run as "draft"."""
    prop = df["proposer"].astype(str).str.lower()
    return prop.str.contains("eagle") | (df["pair"].astype(str).str.lower().str.contains("eagle") & (prop == "draft"))


def _desc(r) -> str:
    return f"bs{int(r['batch'])}, k={int(r['k'])}, {r['proposer']}"


class _Data:
    """Lazily computed analyses for one profile; a missing study is remembered as its one-line reason.
    `engine` keeps only that engine's speedup rows (None: all)."""

    def __init__(self, profile, engine: str | None = None):
        self.profile, self.engine, self._cache = profile, engine, {}

    def get(self, name, fn, *args, **kwargs):
        if name not in self._cache:
            try:
                self._cache[name] = (fn(*args, **kwargs), "")
            except SpecdecError as e:
                self._cache[name] = (None, str(e))
        return self._cache[name]

    def speedup(self):
        sp, why = self.get("speedup", views.speedup, self.profile)
        if sp is None or self.engine is None or "engine" not in sp:
            return sp, why
        sel = sp[sp["engine"] == self.engine]
        return (sel, "") if len(sel) else (None, f"no {self.engine} runs of the batch study on {self.profile}")

    def engines(self) -> set:
        sp, _ = self.get("speedup", views.speedup, self.profile)
        return set(sp["engine"]) if sp is not None and "engine" in sp and views.measured(self.profile, "batch") else set()


def _sd_cells(sp: pd.DataFrame) -> pd.DataFrame:
    return sp[(sp["k"] > 0) & (sp["quant"] == "none") & sp["alpha"].isna()]


# -- claims -------------------------------------------------------------------------------------------------
def _eagle_claim(cid, d: _Data, batch, claimed, k=None):
    lo_b, hi_b = _band(claimed)
    where = f"bs{batch}" + (f", k={k}" if k else "")
    rule = f"EAGLE speedup at {where} within +-{REL_TOL:.0%} of {claimed}x: [{lo_b:.2f}, {hi_b:.2f}]"
    sp, why = d.speedup()
    if sp is None:
        return _row(cid, rule, NOT_MEASURABLE, why)
    sd = _sd_cells(sp)
    sel = sd[(sd["batch"] == batch) & ((sd["k"] == k) if k else True)]
    eagle = sel[_is_eagle(sel)]
    note = "" if d.profile == "h100" else f"; the claim is for H100, this is profile '{d.profile}'"
    if eagle.empty:
        proposers = ", ".join(sorted(set(sd["proposer"]))) or "none"
        if sel.empty:
            bs = ", ".join(str(b) for b in sorted(set(sd["batch"])))
            return _row(cid, rule, NOT_MEASURABLE, f"no EAGLE runs (proposers measured: {proposers}) and no SD cell "
                        f"at bs{batch}{f', k={k}' if k else ''} (batch sizes measured: {bs})")
        best = sel.loc[sel["speedup"].idxmax()]
        return _row(cid, rule, NOT_MEASURABLE,
                    f"no EAGLE runs (proposers measured: {proposers}); number shown: best analogue ({_desc(best)})",
                    best["speedup"], best["ci_lo"], best["ci_hi"],
                    analysis.fmt_ci(best["speedup"], best["ci_lo"], best["ci_hi"], unit="x") + f" [{_desc(best)}]")
    best = eagle.loc[eagle["speedup"].idxmax()]
    ok = lo_b <= best["speedup"] <= hi_b
    return _row(cid, rule, REPRODUCED if ok else NOT_REPRODUCED,
                f"EAGLE {_desc(best)}" + _crosses(best["ci_lo"], best["ci_hi"], lo_b, hi_b) + note,
                best["speedup"], best["ci_lo"], best["ci_hi"],
                analysis.fmt_ci(best["speedup"], best["ci_lo"], best["ci_hi"], unit="x"))


def _c3(d: _Data):
    claimed = 2.5
    lo_b, hi_b = _band(claimed)
    rule = f"best SD speedup at bs1 within +-{REL_TOL:.0%} of {claimed}x: [{lo_b:.2f}, {hi_b:.2f}]"
    sp, why = d.speedup()
    if sp is None:
        return _row("C3", rule, NOT_MEASURABLE, why)
    sel = _sd_cells(sp)
    sel = sel[sel["batch"] == 1]
    if sel.empty:
        return _row("C3", rule, NOT_MEASURABLE, "no SD cell at batch size 1")
    best = sel.loc[sel["speedup"].idxmax()]
    s = best["speedup"]
    verdict = REPRODUCED if lo_b <= s <= hi_b else NOT_REPRODUCED
    where = "in the band" if verdict == REPRODUCED else ("below the band" if s < lo_b else "above the band")
    return _row("C3", rule, verdict, f"best of {len(sel)} SD cells ({_desc(best)}) is {where}"
                + _crosses(best["ci_lo"], best["ci_hi"], lo_b, hi_b),
                s, best["ci_lo"], best["ci_hi"],
                analysis.fmt_ci(s, best["ci_lo"], best["ci_hi"], unit="x") + f" [{_desc(best)}]")


def _sd_above(d: _Data, cid: str, rule: str, above: int):
    """(SD cells with batch > above, None) or (None, the 'not measurable here' row saying why)."""
    sp, why = d.speedup()
    if sp is None:
        return None, _row(cid, rule, NOT_MEASURABLE, why)
    sd = _sd_cells(sp)
    sel = sd[sd["batch"] > above]
    if sel.empty:
        return None, _row(cid, rule, NOT_MEASURABLE, f"no batch size > {above} measured (max {sd['batch'].max()})")
    return sel, None


def _c4(d: _Data):
    thr, above = 1.1, 8
    rule = f"every SD cell with batch > {above} has speedup < {thr}; number: the largest"
    sel, missing = _sd_above(d, "C4", rule, above)
    if missing:
        return missing
    worst = sel.loc[sel["speedup"].idxmax()]
    ok = worst["speedup"] < thr
    return _row("C4", rule, REPRODUCED if ok else NOT_REPRODUCED,
                f"{len(sel)} SD cells at bs {', '.join(str(b) for b in sorted(set(sel['batch'])))}; "
                f"largest at {_desc(worst)}" + _crosses(worst["ci_lo"], worst["ci_hi"], upper=thr),
                worst["speedup"], worst["ci_lo"], worst["ci_hi"],
                analysis.fmt_ci(worst["speedup"], worst["ci_lo"], worst["ci_hi"], unit="x") + f" [{_desc(worst)}]")


def _c5(d: _Data):
    lo_t, hi_t, above = 0.8, 1.0, 32
    rule = f"every SD cell with batch > {above} has {lo_t} <= speedup < {hi_t}; number: the one farthest outside"
    sel, missing = _sd_above(d, "C5", rule, above)
    if missing:
        return missing
    dist = np.maximum(lo_t - sel["speedup"], sel["speedup"] - hi_t)  # > 0 outside, <= 0 inside
    worst = sel.loc[dist.idxmax()]
    ok = ((sel["speedup"] >= lo_t) & (sel["speedup"] < hi_t)).all()
    return _row("C5", rule, REPRODUCED if ok else NOT_REPRODUCED,
                f"{len(sel)} SD cells, speedups {sel['speedup'].min():.2f}-{sel['speedup'].max():.2f}"
                + _crosses(worst["ci_lo"], worst["ci_hi"], lo_t, hi_t),
                worst["speedup"], worst["ci_lo"], worst["ci_hi"],
                analysis.fmt_ci(worst["speedup"], worst["ci_lo"], worst["ci_hi"], unit="x") + f" [{_desc(worst)}]")


def _c6(cid, d: _Data, claimed: float, large: bool):
    lo_b, hi_b = claimed - ALPHA_TOL, claimed + ALPHA_TOL
    size = "large (target >= %gB)" % LARGE_TARGET_B if large else "small (target < %gB)" % LARGE_TARGET_B
    rule = f"{size} pair: break-even acceptance within +-{ALPHA_TOL} of {claimed} ([{lo_b:.1f}, {hi_b:.1f}]) " \
           f"at every measured batch size; number: the farthest"
    be, why = d.get("break_even", lambda g: views.break_even(g)[1], d.profile)
    if be is not None and be.empty:
        be, why = None, "no break-even cells (synthetic acceptance) measured"
    if be is None:
        return _row(cid, rule, NOT_MEASURABLE, why)
    pairs = sorted(set(be["pair"].dropna()))
    sel = be[[_is_large(p) == large for p in be["pair"]]]
    if sel.empty:
        desc = ", ".join(f"{p} (target {target_billions(p) or '?'}B)" for p in pairs) or "unknown"
        return _row(cid, rule, NOT_MEASURABLE, f"no {size.split(' ')[0]} pair measured; pairs: {desc}")
    parts, dist = [], []
    for _, r in sel.iterrows():
        v = r["break_even"]
        if np.isnan(v):
            parts.append(f"bs{r['batch']}: n/a ({r['note']})")
            dist.append(np.inf)
        else:
            parts.append(f"bs{r['batch']}: " + analysis.fmt_ci(v, r["ci_lo"], r["ci_hi"]))
            dist.append(abs(v - claimed))
    worst = sel.iloc[int(np.argmax(dist))]
    ok = all(x <= ALPHA_TOL + 1e-12 for x in dist)
    return _row(cid, rule, REPRODUCED if ok else NOT_REPRODUCED,
                f"pair {', '.join(pairs)}; deciding cell bs{worst['batch']}"
                + (_crosses(worst["ci_lo"], worst["ci_hi"], lo_b, hi_b) if not np.isnan(worst["break_even"]) else ""),
                worst["break_even"], worst["ci_lo"], worst["ci_hi"], "; ".join(parts))


def _overhead_reps(profile: str) -> tuple[str, dict, dict] | None:
    """(metric, {cell key: estimate}, {cell key: bootstrap replicates}) for one profile, or None."""
    try:
        df = analysis.draft_overhead(profile, "batch", replicates=True)
        df = df[(df["proposer"] == "draft") & (df["quant"] == "none") & df["alpha"].isna()]
        if len(df):
            keys = [(int(r["batch"]), int(r["k"])) for _, r in df.iterrows()]
            return ("step draft share", dict(zip(keys, df["draft_frac"])), dict(zip(keys, df["replicates"])))
    except SpecdecError:
        pass
    try:
        df = analysis.forward_ratio(profile, "hardware", replicates=True)
        keys = [(int(r["batch"]), int(r["query"]), float(r["context"])) for _, r in df.iterrows()]
        return ("draft/target forward time", dict(zip(keys, df["ratio"])), dict(zip(keys, df["replicates"])))
    except SpecdecError:
        return None


def _key_text(key: tuple) -> str:
    return f"bs{key[0]}, k={key[1]}" if len(key) == 2 else f"bs{key[0]}, q={key[1]}, ctx={key[2]:g}"


def _predicted_shares(profile: str, pair: str, context: float) -> dict:
    """EAGLE draft share of step time at k=3 per batch size from the roofline prior of `profile`."""
    costs = costmodel.prior(profile, pair)
    return {b: float(costs.draft_share(b, 3, context, "eagle")) for b in views.BATCHES}


def _c7_predicted(rule: str, missing: list[str]):
    names = tr.collections()
    if not names:
        return None
    name = (tr.for_profile("h100") or names)[0]
    pair = tr.source(name)["pair"]
    ctx = float(np.mean([r.prompt_len + r.generated_len / 2 for d in tr.datasets(name)
                         for r in tr.load(name, d, "eagle").requests]))
    try:
        h, a = _predicted_shares("h100", pair, ctx), _predicted_shares("a100", pair, ctx)
    except SpecdecError:
        return None
    diff = float(np.mean([h[b] - a[b] for b in h]))
    extra = ""
    try:
        share = float(costmodel.published("h100", pair).draft_share(1, 3, ctx, "eagle"))
        extra = f"; the paper's own H100 fit gives a share of {share:.2f} at bs1"
    except SpecdecError:
        pass
    row = _row("C7", rule, REPRODUCED if diff > 0 else NOT_REPRODUCED,
               f"PREDICTED (no {' or '.join(missing)} measurements): roofline priors of both profiles for {pair}, "
               f"EAGLE k=3, {ctx:.0f} KV tokens/seq, bs {', '.join(map(str, h))}; share H100 {np.mean(list(h.values())):.3f}"
               f" vs A100 {np.mean(list(a.values())):.3f}" + extra, diff,
               text=f"{diff:+.4f} (H100 - A100 draft share, predicted)")
    row["basis"] = "predicted"
    return row


def _c7(d: _Data):
    rule = "mean paired difference (H100 - A100) of the draft-overhead share over common cells > 0"
    have = {p: _overhead_reps(p) for p in ("h100", "a100")}
    if any(v is None for v in have.values()):
        pred = _c7_predicted(rule, [p for p, v in have.items() if v is None])
        if pred is not None:
            return pred
        others = [p for p in analysis.profiles() if p not in ("h100", "a100")]
        ctx = []
        for p in others:
            ov = _overhead_reps(p)
            if ov:
                k0 = min(ov[1])
                ctx.append(f"{p}: {ov[0]} {ov[1][k0]:.2f} at {_key_text(k0)}")
        missing = [p for p, v in have.items() if v is None]
        return _row("C7", rule, NOT_MEASURABLE,
                    f"no draft-overhead data for {' and '.join(missing)} (profiles with data: "
                    f"{', '.join(p for p in analysis.profiles() if _overhead_reps(p)) or 'none'})",
                    text="; ".join(ctx) or "n/a")
    (m1, e1, r1), (m2, e2, r2) = have["h100"], have["a100"]
    if m1 != m2 or not set(e1) & set(e2):
        return _row("C7", rule, NOT_MEASURABLE, "H100 and A100 runs share no comparable cell")
    common = sorted(set(e1) & set(e2))
    diff = float(np.mean([e1[k] - e2[k] for k in common]))
    reps = np.mean([r1[k] - r2[k] for k in common], axis=0)
    lo, hi = analysis.ci(reps)
    return _row("C7", rule, REPRODUCED if diff > 0 else NOT_REPRODUCED,
                f"{m1}, {len(common)} common cells" + _crosses(lo, hi, lower=0.0), diff, lo, hi)


def _c8(d: _Data):
    rule = (f"an alternative (quantization, or continuous batching vs serving one at a time) reaches >= "
            f"{AS_GOOD} x the best SD speedup in >= {OFTEN:.0%} of the settings")
    df, why = d.get("alternatives", analysis.alternatives, d.profile, "alternatives", replicates=True)
    if df is None:
        return _row("C8", rule, NOT_MEASURABLE, why)
    comps, labels = [], []  # (alt replicate array, alt estimate, sd replicates, sd estimate)
    sd = df[df["option"] == "SD"]
    for b, g in sd.groupby("batch"):
        best = g.loc[g["speedup"].idxmax()]
        for _, q in df[(df["batch"] == b) & (df["k"] == 0) & (df["mode"] == "static") &
                       (df["quant"] != "none")].iterrows():
            comps.append((q["replicates"], q["speedup"], best["replicates"], best["speedup"]))
            labels.append(f"{q['quant']} bs{b}: {q['speedup']:.2f} vs SD {best['speedup']:.2f}")
    sd1 = sd[sd["batch"] == sd["batch"].min()] if len(sd) else sd
    if len(sd1):
        best = sd1.loc[sd1["speedup"].idxmax()]
        for _, c in df[df["option"] == "continuous batching"].iterrows():
            comps.append((c["replicates"], c["speedup"], best["replicates"], best["speedup"]))
            labels.append(f"CB rate {c['rate']:g}/s: {c['speedup']:.2f} vs SD bs{best['batch']} {best['speedup']:.2f}")
    if not comps:
        return _row("C8", rule, NOT_MEASURABLE, "no setting with both SD and an alternative measured")
    est = float(np.mean([a >= AS_GOOD * s for _, a, _, s in comps]))
    with np.errstate(invalid="ignore"):
        hits = np.array([(ra >= AS_GOOD * rs).astype(float) for ra, _, rs, _ in comps])
        nan = np.array([np.isnan(ra) | np.isnan(rs) for ra, _, rs, _ in comps]).any(0)
    reps_frac = np.where(nan, np.nan, hits.mean(0))
    lo, hi = analysis.ci(reps_frac)
    return _row("C8", rule, REPRODUCED if est >= OFTEN else NOT_REPRODUCED,
                f"{len(comps)} settings: " + "; ".join(labels) + _crosses(lo, hi, lower=OFTEN), est, lo, hi,
                analysis.fmt_ci(est, lo, hi) + " of settings")


def _c8s(d: _Data):
    """C8 with a production-serving basis: per served setting (proposer x request rate), is the no-SD server
    (continuous batching alone) within AS_GOOD of the SD server's speed per output token?"""
    from . import servestats
    rule = (f"the no-SD server (continuous batching alone) reaches >= {AS_GOOD} x the SD server's speed per output "
            f"token (median TPOT, paired windows) in >= {OFTEN:.0%} of the served settings (proposer x rate)")
    df, why = d.get("serving", servestats.paired, d.profile, replicates=True)
    if df is None:
        return _row("C8s", rule, NOT_MEASURABLE, why)
    t = df[df["metric"] == "tpot_p50"]
    # SD's speedup over the no-SD server <= 1 / AS_GOOD  <=>  the no-SD server is "as good"
    est = float(np.mean(t["speedup"] <= 1 / AS_GOOD))
    with np.errstate(invalid="ignore"):
        reps = np.array([(r <= 1 / AS_GOOD).astype(float) for r in t["replicates"]])
        nan = np.array([np.isnan(r) for r in t["replicates"]]).any(0)
    lo, hi = analysis.ci(np.where(nan, np.nan, reps.mean(0)))
    labels = [f"{r.proposer} {r.rate:g}/s: SD {r.speedup:.2f}x" for r in t.sort_values(["proposer", "rate"]).itertuples()]
    row = _row("C8s", rule, REPRODUCED if est >= OFTEN else NOT_REPRODUCED,
               f"{len(t)} settings: " + "; ".join(labels) + _crosses(lo, hi, lower=OFTEN), est, lo, hi,
               analysis.fmt_ci(est, lo, hi) + " of settings")
    return dict(row, basis="measured, vllm server")


def verdicts(profile: str) -> pd.DataFrame:
    """One row per claim: the measured number with its 95% CI from profile `profile` (all profiles for C7),
    the rule, and the verdict ("reproduced" / "not reproduced" / "not measurable here") with its reason."""
    d = _Data(profile)

    def speedup_claims(data):
        return [_eagle_claim("C1", data, batch=1, claimed=1.96, k=3),
                _eagle_claim("C2", data, batch=128, claimed=1.21), _c3(data), _c4(data), _c5(data)]

    rows = speedup_claims(d)
    if "vllm" in d.engines():  # the production engine decides; the torch engine's answer stands beside it
        by_vllm, by_torch = speedup_claims(_Data(profile, "vllm")), speedup_claims(_Data(profile, "torch"))
        rows = []
        for v, t in zip(by_vllm, by_torch):
            basis = "measured, vllm"
            rows.append(dict(v, basis=basis, torch_engine=f"{t['measured_text']} ({t['verdict']})"))
    rows += [_c6("C6a", d, 0.7, large=False), _c6("C6b", d, 0.9, large=True), _c7(d), _c8(d), _c8s(d)]
    df = pd.DataFrame(rows)
    df["torch_engine"] = df["torch_engine"].fillna("") if "torch_engine" in df else ""
    df["profile"] = profile
    basis = {study: views.mode(profile, study).kind for study in set(CLAIM_STUDY.values())}
    given = df["basis"] if "basis" in df else pd.Series([None] * len(df))
    if basis.get("batch") == "measured" and views.synthetic(profile, "batch"):
        basis["batch"] = "measured (synthetic weights, replayed acceptance, torch engine)"
    df["basis"] = [g if isinstance(g, str) else basis[CLAIM_STUDY[c]] for c, g in zip(df["claim"], given)]
    df.loc[df["verdict"] == NOT_MEASURABLE, "basis"] = df.loc[df["verdict"] == NOT_MEASURABLE, "basis"].replace(
        "predicted", "none")
    return df[COLUMNS]


def to_markdown(df: pd.DataFrame) -> str:
    """The verdict table as GitHub markdown (no extra dependency)."""
    cols = [("claim", "Claim"), ("statement", "Statement"), ("basis", "Basis"), ("rule", "Rule"),
            ("measured_text", "Number (95% CI)"), ("verdict", "Verdict"), ("reason", "Reason"),
            ("torch_engine", "Torch engine (same cells)")]
    esc = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(esc(r[c]) for c, _ in cols) + " |")
    prof = ", ".join(sorted(set(df["profile"]))) if "profile" in df else "?"
    head = (f"# Claims check: profile {prof}\n\nBasis: 'measured' = our raw runs; 'predicted' = no runs on this "
            f"profile, so the number comes from acceptance traces replayed through a cost model (see the reason); "
            f"'measured, vllm' = decided on vLLM's runs, with our torch engine's answer on the same cells beside it; "
            f"'synthetic weights, replayed acceptance' = real timings of random weights in the real shapes, each step "
            f"accepting what the paper's traces say; "
            f"a predicted verdict tests the claim against the paper's own published inputs, not against new "
            f"measurements.\nVerdicts are decided on point estimates; tolerances: "
            f"+-{REL_TOL:.0%} for x-fold numbers, +-{ALPHA_TOL} for acceptance, 'as good' = >= {AS_GOOD} x SD, "
            f"'often' = >= {OFTEN:.0%} of settings.\n\n")
    return head + "\n".join(lines) + "\n"
