"""Figures and tables of the studies: plotting helpers that take analysis DataFrames and return a Figure,
plus writers for figures/<profile>/<name>.{png,pdf} and build/<profile>/<name>.csv.

Output roots: $SPECDEC_FIGURES (default <repo>/figures) and $SPECDEC_BUILD (default <repo>/build).
Figure and table names start with the study stem (batch-speedup, acceptance-positions, ...).
Plot helpers never raise on empty input: they draw a placeholder that says why there is no data, so a
notebook always writes the same set of files.
"""
from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import matplotlib

if "inline" not in str(matplotlib.get_backend()).lower():
    matplotlib.use("Agg")  # headless; notebooks keep their inline (Agg-based) backend for display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from .. import paths  # noqa: E402

sns.set_theme(style="whitegrid", context="paper", palette="colorblind")
WIDTH = 6.4


# -- output ---------------------------------------------------------------------------------------------------
def figures_dir(profile: str) -> Path:
    return Path(os.environ.get("SPECDEC_FIGURES") or paths.root() / "figures") / profile


def build_dir(profile: str) -> Path:
    return paths.build_root() / profile


def save(fig, profile: str, name: str) -> list[Path]:
    """Write figures/<profile>/<name>.png (150 dpi) and .pdf; returns the two paths."""
    folder = figures_dir(profile)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for ext in ("png", "pdf"):
        path = folder / f"{name}.{ext}"
        fig.savefig(path, dpi=150, bbox_inches="tight", metadata={"CreationDate": None} if ext == "pdf" else None)
        out.append(path)
    return out


def save_table(df: pd.DataFrame, profile: str, name: str) -> Path:
    """Write build/<profile>/<name>.csv (floats with 6 significant digits); returns the path."""
    folder = build_dir(profile)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.csv"
    df.drop(columns=["replicates"], errors="ignore").to_csv(path, index=False, float_format="%.6g")
    return path


def save_text(text: str, profile: str, filename: str) -> Path:
    """Write build/<profile>/<filename> (e.g. claims.md); returns the path."""
    folder = build_dir(profile)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    path.write_text(text)
    return path


# -- helpers ----------------------------------------------------------------------------------------------------
def placeholder(title: str, reason: str):
    """A figure that only says there is no data, and why."""
    fig, ax = plt.subplots(figsize=(WIDTH, 2.0))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, "no data: " + (reason or "nothing measured"), ha="center", va="center", wrap=True,
            fontsize=8, transform=ax.transAxes)
    return fig


def stamp(fig, source):
    """Label a figure with where its numbers come from: "MEASURED: data/raw/..." or "PREDICTED: traces + costs"
    as a footer, and " [predicted]" appended to every title when predicted. `source` is a views.Source."""
    text = source.label if hasattr(source, "label") else str(source)
    predicted = getattr(source, "kind", "") == "predicted"
    if predicted:
        for ax in fig.axes:
            if ax.get_title():
                ax.set_title(ax.get_title() + " [predicted]")
        if fig._suptitle is not None:
            fig.suptitle(fig._suptitle.get_text() + " [predicted]")
    import textwrap
    fig.text(0.01, -0.01, "\n".join(textwrap.wrap(text, 150)), ha="left", va="top", fontsize=5,
             color="tab:red" if predicted else "0.3")
    return fig


def plot(title: str, size=(WIDTH, 4.0), empty=None, legend=True):
    """The skeleton every single-panel figure shares, written once: title from `title` (formatted with profile),
    a placeholder saying why when there is no data, one Axes of `size` (inches, or a function of the data),
    the title unless the drawing set its own, a small legend when something is labelled, tight layout.

    Decorates draw(ax, df, profile=..., **kwargs); the figure function is fn(df, profile, note="", **kwargs).
    `empty(df)` -> a reason string when there is nothing to draw (default: df.empty)."""
    def wrap(draw):
        @functools.wraps(draw)
        def figure(df, profile: str, note: str = "", **kwargs):
            name = title.format(profile=profile)
            why = empty(df) if empty else ("" if not df.empty else "nothing measured")
            if why:
                return placeholder(name, note or why)
            fig, ax = plt.subplots(figsize=size(df) if callable(size) else size)
            draw(ax, df, profile=profile, **kwargs)
            if not ax.get_title():
                ax.set_title(name)
            if legend and ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, **({} if legend is True else legend))
            fig.tight_layout()
            return fig
        return figure
    return wrap


def _err(df: pd.DataFrame, y: str, lo: str = "ci_lo", hi: str = "ci_hi"):
    """Asymmetric error bars (2, n) from CI columns; NaN bounds give no bar."""
    low = (df[y] - df[lo]).clip(lower=0).fillna(0).to_numpy()
    high = (df[hi] - df[y]).clip(lower=0).fillna(0).to_numpy()
    return np.vstack([low, high])


def _series_label(r) -> str:
    return "no SD (k=0)" if r["k"] == 0 else f"{r['proposer']} k={r['k']}"


def _log2_batch(ax, batches) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(b) for b in batches))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()


# -- batch study ------------------------------------------------------------------------------------------------
ENGINE_MARKERS = {"vllm": "s", "torch": "o"}


def _lines_vs_batch(ax, df: pd.DataFrame, y: str, lo: str = "ci_lo", hi: str = "ci_hi", dashed_baseline=False):
    """One errorbar line per (engine x) proposer x k of `y` against batch size (log2 axis); where both engines
    measured, the label names the engine and vLLM's points are squares, the torch engine's dotted."""
    df = df if "engine" in df else df.assign(engine="torch")
    trace = df["trace"].astype(object).where(df["trace"].notna(), "") if "trace" in df else ""
    df = df.assign(trace=trace)  # a replayed dataset: a line each
    both, traces = df["engine"].nunique() > 1, df["trace"].nunique() > 1
    for (eng, _, k, trace), g in df.sort_values("batch").groupby(["engine", "proposer", "k", "trace"]):
        label = _series_label(g.iloc[0]) + (f" [{eng}]" if both else "") + (f", {trace}" if traces else "")
        ls = "--" if dashed_baseline and k == 0 else (":" if both and eng == "torch" else "-")
        ax.errorbar(g["batch"], g[y], yerr=_err(g, y, lo, hi), marker=ENGINE_MARKERS.get(eng, "o"), capsize=3,
                    label=label, ls=ls)
    _log2_batch(ax, df["batch"])


@plot("SD speedup vs batch size ({profile})", empty=lambda sp: "" if len(sp) and (sp["k"] > 0).any()
      else "no speculative cells")
def batch_speedup(ax, sp: pd.DataFrame, profile: str):
    """Speedup vs batch size, one line per proposer x k, 95% CI bars, the no-SD level at 1."""
    _lines_vs_batch(ax, sp[sp["k"] > 0], "speedup")
    ax.axhline(1.0, color="k", lw=1, ls="--", label="no SD")
    ax.set(xlabel="batch size (sequences)", ylabel="speedup over no-SD decode throughput")


@plot("decode throughput vs batch size ({profile})")
def batch_throughput(ax, sp: pd.DataFrame, profile: str):
    """Decode throughput (tokens/s) vs batch size, one line per proposer x k incl. the no-SD baseline."""
    _lines_vs_batch(ax, sp, "throughput_tok_s", "tp_ci_lo", "tp_ci_hi", dashed_baseline=True)
    ax.set_yscale("log")
    ax.set(xlabel="batch size (sequences)", ylabel="decode throughput (tokens/s)")


@plot("proposal share of step time ({profile})", size=(WIDTH, 3.6))
def batch_overhead(ax, ov: pd.DataFrame, profile: str):
    """Share of step time spent proposing (draft_s / step time) vs batch size."""
    _lines_vs_batch(ax, ov, "draft_frac")
    ax.set_ylim(0, 1)
    ax.set(xlabel="batch size (sequences)", ylabel="draft_s / (draft + verify + other)")


def batch_engines(eng: pd.DataFrame, profile: str, note: str = ""):
    """Engine fidelity: left, each SD cell's speedup on vLLM (x) against our torch engine (y) with both 95%
    CIs and the y = x line; right, no-SD throughput torch / vLLM per batch size, raw and divided by the
    runs' read-bandwidth probes."""
    title = f"engine fidelity: vLLM vs our torch engine ({profile})"
    if eng.empty:
        return placeholder(title, note)
    fig, (a, b) = plt.subplots(1, 2, figsize=(WIDTH * 1.6, 4.0))
    sd = eng[eng["k"] > 0]
    for (prop, k), g in sd.groupby(["proposer", "k"]):
        a.errorbar(g["vllm_speedup"], g["torch_speedup"], xerr=_err(g, "vllm_speedup", "vllm_ci_lo", "vllm_ci_hi"),
                   yerr=_err(g, "torch_speedup", "torch_ci_lo", "torch_ci_hi"), marker="o", ls="none", capsize=3,
                   label=f"{prop} k={k}")
        for _, r in g.iterrows():
            a.annotate(f"bs{int(r['batch'])}", (r["vllm_speedup"], r["torch_speedup"]), fontsize=6,
                       xytext=(3, 3), textcoords="offset points")
    if len(sd):
        lim = [0, max(1.2, float(np.nanmax(sd[["vllm_ci_hi", "torch_ci_hi", "vllm_speedup", "torch_speedup"]]
                                          .to_numpy(float))) * 1.05)]
        a.plot(lim, lim, color="0.5", lw=1, ls="--", label="same speedup")
        a.axhline(1, color="k", lw=0.8, ls=":")
        a.axvline(1, color="k", lw=0.8, ls=":")
        a.set(xlim=lim, ylim=lim)
        a.legend(fontsize=7)
    a.set(xlabel="SD speedup, vLLM (paired)", ylabel="SD speedup, torch engine (paired)", title="SD speedup per cell")
    base = eng.groupby("batch")[["base_ratio", "base_ratio_probe"]].median().reset_index()
    b.plot(base["batch"], base["base_ratio"], marker="o", label="raw")
    b.plot(base["batch"], base["base_ratio_probe"], marker="s", label="per unit of probed bandwidth")
    b.axhline(1, color="k", lw=0.8, ls="--")
    _log2_batch(b, base["batch"])
    b.set(xlabel="batch size (sequences)", ylabel="no-SD throughput, torch / vLLM", title="plain decoding")
    b.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# -- acceptance study -------------------------------------------------------------------------------------------
def acceptance_positions(pos: pd.DataFrame, profile: str, note: str = ""):
    """P(accept position i | tried i) vs i, one panel per proposer x temperature, hue = prompt set (and engine,
    dashed for vLLM, where both measured: vLLM's counters are one unit per run, its prompt sets pooled)."""
    title = f"acceptance by draft position ({profile})"
    if pos.empty:
        return placeholder(title, note)
    eng = pos["engine"].astype(str) if "engine" in pos else pd.Series("torch", index=pos.index)
    pos = pos.assign(prompt_set=pos["prompt_set"].astype(str) + (" (" + eng + ")" if eng.nunique() > 1 else ""))
    panels = pos[["proposer", "temperature"]].drop_duplicates().sort_values(["proposer", "temperature"])
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(max(WIDTH, 3 * n), 3.4), sharey=True, squeeze=False)
    sets = sorted(pos["prompt_set"].unique())
    colors = dict(zip(sets, sns.color_palette(n_colors=len(sets))))
    for ax, (_, p) in zip(axes[0], panels.iterrows()):
        sub = pos[(pos["proposer"] == p["proposer"]) & (pos["temperature"] == p["temperature"])]
        several = len(sub[["k", "batch"]].drop_duplicates()) > 1
        for (ps, k, b), g in sub.groupby(["prompt_set", "k", "batch"]):
            g = g.sort_values("position")
            ax.errorbar(g["position"], g["p_accept"], yerr=_err(g, "p_accept"), marker="o", capsize=3,
                        color=colors[ps], linestyle="--" if ps.endswith("(vllm)") else "-",
                        label=f"{ps}, k={k}, bs{b}" if several else ps)
        ax.set(title=f"{p['proposer']}, T={p['temperature']:g}", xlabel="draft position i")
        ax.set_ylim(0, 1.05)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes[0][0].set_ylabel("P(accept i | tried i)")
    axes[0][-1].legend(title="prompt set", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@plot("per-request acceptance ({profile})", size=(WIDTH, 3.6), legend={"title": None})
def acceptance_requests(ax, req: pd.DataFrame, profile: str):
    """Distribution of per-request acceptance (alpha_measured) by prompt set and proposer."""
    d = req.assign(setting=req["proposer"] + ", T=" + req["temperature"].map("{:g}".format))
    with warnings.catch_warnings():  # seaborn 0.13 passes matplotlib's deprecated `vert` to boxplot
        warnings.simplefilter("ignore", matplotlib.MatplotlibDeprecationWarning)
        sns.boxplot(data=d, x="prompt_set", y="alpha_measured", hue="setting", ax=ax, fliersize=0, width=0.6)
    sns.stripplot(data=d, x="prompt_set", y="alpha_measured", hue="setting", ax=ax, dodge=True, size=3,
                  palette="dark:k", alpha=0.5, legend=False)
    ax.set(xlabel="prompt set", ylabel="accepted / tried positions per request", ylim=(0, 1.05))


@plot("real traces vs i.i.d. acceptance ({profile})", size=(4.8, 4.4))
def acceptance_iid(ax, iid: pd.DataFrame, profile: str):
    """Measured tokens/step vs the i.i.d. prediction at the same mean acceptance (y = x is a perfect fit)."""
    for (synth, prop), g in iid.groupby(["synthetic", "proposer"]):
        label = f"{prop}, {'synthetic alpha' if synth else 'real'}"
        ax.errorbar(g["predicted_tps"], g["measured_tps"],
                    yerr=_err(g, "measured_tps", "measured_ci_lo", "measured_ci_hi"),
                    marker="s" if synth else "o", ls="none", capsize=3, label=label)
    hi = float(np.nanmax(iid[["predicted_tps", "measured_tps"]].to_numpy())) * 1.05
    ax.plot([1, hi], [1, hi], "k--", lw=1, label="y = x")
    ax.set(xlabel="i.i.d. prediction (1 - a^(k+1)) / (1 - a)", ylabel="measured tokens per step")


def acceptance_breakeven(syn: pd.DataFrame, be: pd.DataFrame, profile: str, note: str = ""):
    """Speedup vs forced acceptance alpha per batch size; where each curve crosses 1 is the break-even."""
    return _breakeven(syn, profile, note, be=be)


@plot("break-even acceptance ({profile})")
def _breakeven(ax, syn: pd.DataFrame, profile: str, be: pd.DataFrame):
    batches = sorted(syn["batch"].unique())
    colors = dict(zip(batches, sns.color_palette(n_colors=len(batches))))
    for (b, k), g in syn.sort_values("alpha").groupby(["batch", "k"]):
        ax.errorbar(g["alpha"], g["speedup"], yerr=_err(g, "speedup"), marker="o", capsize=3, color=colors[b],
                    label=f"bs{b}, k={k}")
        row = be[(be["batch"] == b) & (be["k"] == k)] if len(be) else be
        if len(row) and np.isfinite(row["break_even"].iloc[0]):
            ax.axvline(row["break_even"].iloc[0], color=colors[b], ls=":", lw=1)
    ax.axhline(1.0, color="k", lw=1, ls="--")
    ax.set_yscale("log")
    ax.set(xlabel="forced acceptance alpha (i.i.d.)", ylabel="speedup over no SD", xlim=(0, 1.05))


# -- hardware study ---------------------------------------------------------------------------------------------
@plot("forward-pass time ({profile})", legend=False)
def hardware_forward(ax, ft: pd.DataFrame, profile: str):
    """Forward-pass time vs batched tokens, per model and KV context."""
    queries = sorted(ft["query"].unique())
    colors = dict(zip(queries, sns.color_palette(n_colors=len(queries))))
    markers = dict(zip(sorted(ft["context"].unique()), "osD^v<>"))
    for (model, q, ctx), g in ft.sort_values("tokens").groupby(["model", "query", "context"]):
        ax.errorbar(g["tokens"], g["seconds"] * 1e3, yerr=_err(g, "seconds") * 1e3, marker=markers.get(ctx, "o"),
                    capsize=3, color=colors[q], ls="-" if model == "target" else "--",
                    label=f"{model}, query {q}, ctx {ctx:g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="tokens per forward (batch x query)", ylabel="forward time (ms)")
    ax.legend(fontsize=6, ncol=2)


@plot("draft / target forward time ({profile})", size=(WIDTH, 3.6))
def hardware_overhead(ax, fr: pd.DataFrame, profile: str):
    """Draft / target forward time at the same batch and query, vs batch size."""
    for (q, ctx), g in fr.sort_values("batch").groupby(["query", "context"]):
        ax.errorbar(g["batch"], g["ratio"], yerr=_err(g, "ratio"), marker="o", capsize=3,
                    label=f"query {q}, ctx {ctx:g}")
    _log2_batch(ax, fr["batch"])
    ax.set(xlabel="batch size (sequences)", ylabel="draft time / target time")


def hardware_profiles(ac: pd.DataFrame, note: str = ""):
    """Draft-overhead measures of every profile with data, side by side (one panel per metric)."""
    title = "draft overhead across hardware profiles"
    if ac.empty:
        return placeholder(title, note)
    metrics = sorted(ac["metric"].unique())
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(WIDTH, 3.4 * len(metrics)), 3.6), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        g = ac[ac["metric"] == m]
        g = g[g["proposer"].isin(["draft"])] if m == "step_draft_frac" else g
        agg = g.groupby(["profile", "batch"], as_index=False)["value"].mean()
        sns.barplot(data=agg, x="batch", y="value", hue="profile", ax=ax)
        ax.set(title={"step_draft_frac": "draft share of step time (draft model)",
                      "forward_ratio": "draft / target forward time"}.get(m, m), xlabel="batch size",
               ylabel="mean over cells")
        ax.legend(fontsize=7, title=None)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# -- alternatives study ---------------------------------------------------------------------------------------------
@plot("SD vs quantization vs batching ({profile})", size=lambda alt: (WIDTH, 0.45 * len(alt) + 1.2), legend=False)
def alternatives_compare(ax, alt: pd.DataFrame, profile: str):
    """Speedup of each alternative over its fp32 no-SD reference (bars, 95% CI)."""
    d = alt.copy()
    d["setting"] = [f"bs{b}" + (f", {r:g}/s" if pd.notna(r) else "") + (f", k={k}" if k else "")
                    for b, r, k in zip(d["batch"], d["rate"], d["k"])]
    options = list(dict.fromkeys(d["option"]))
    colors = dict(zip(options, sns.color_palette(n_colors=len(options))))
    y = np.arange(len(d))
    ax.barh(y, d["speedup"], xerr=_err(d, "speedup"), color=[colors[o] for o in d["option"]], capsize=3)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{o} ({s})" for o, s in zip(d["option"], d["setting"])], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="k", lw=1, ls="--")
    ax.set(xlabel="speedup over fp32 no-SD reference (see table: same batch, or bs1 for batching)")


def alternatives_latency(lat: pd.DataFrame, profile: str, note: str = ""):
    """Latency and time-to-first-token percentiles of the continuous-batching cells, by arrival rate and k."""
    title = f"continuous batching latency ({profile})"
    if lat.empty:
        return placeholder(title, note)
    d = lat[lat["metric"].isin(["latency_s", "ttft_s"])].copy()
    d["series"] = [f"{'no SD' if k == 0 else f'SD k={k}'}, p{q}" for k, q in zip(d["k"], d["quantile"])]
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH * 1.3, 3.6), sharex=True, squeeze=False)
    for ax, metric in zip(axes[0], ["latency_s", "ttft_s"]):
        for s, g in d[d["metric"] == metric].sort_values("rate").groupby("series"):
            ax.errorbar(g["rate"], g["value_s"], yerr=_err(g, "value_s"), marker="o", capsize=3, label=s,
                        ls="-" if "no SD" in s else "--")
        ax.set(xlabel="arrival rate (requests/s)", ylabel="seconds",
               title={"latency_s": "request latency", "ttft_s": "time to first token"}[metric])
        ax.set_xscale("log")
        rates = sorted(d["rate"].dropna().unique())
        ax.set_xticks(rates)
        ax.set_xticklabels([f"{r:g}" for r in rates])
        ax.minorticks_off()
    axes[0][1].legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# -- serving study ----------------------------------------------------------------------------------------------
PROPOSER_COLORS = {"draft": "tab:blue", "ngram": "tab:orange", "eagle": "tab:green", "eagle3": "tab:olive"}


def serving_curves(lat: pd.DataFrame, profile: str, note: str = ""):
    """Latency vs achieved throughput, one point per rate: SD servers solid, their paired no-SD servers dotted
    in the same colour; median time per output token (left) and median end-to-end latency (right)."""
    title = f"vLLM server under Poisson load: latency vs throughput ({profile})"
    if lat.empty:
        return placeholder(title, note)
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH * 1.3, 3.6), squeeze=False)
    for ax, (col, name) in zip(axes[0], [("tpot_s_p50", "median time per output token (s)"),
                                         ("e2e_s_p50", "median end-to-end latency (s)")]):
        for (prop, k, arm), g in lat.sort_values("rate").groupby(["proposer", "k", "arm"]):
            sd = arm == "cell" and k > 0
            ax.plot(g["tok_s"], g[col], marker="o" if sd else "x", ls="-" if sd else ":",
                    color=PROPOSER_COLORS.get(prop, "tab:gray"),
                    label=f"{prop} k={k}" if sd else f"SD off (paired with {prop})")
            for r in g.itertuples():
                ax.annotate(f"{r.rate:g}/s", (r.tok_s, getattr(r, col)), fontsize=5, alpha=0.7)
        ax.set(xlabel="achieved throughput (output tokens/s)", ylabel=name)
    axes[0][1].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def serving_speedup(paired: pd.DataFrame, static: pd.DataFrame, profile: str, note: str = ""):
    """Where SD stops paying: the paired speedup of the SD server over the no-SD server (median time per output
    token, 95% CI) by request rate (left), beside vLLM's static-batch speedup by batch size (right)."""
    title = f"where SD stops paying ({profile})"
    if paired.empty:
        return placeholder(title, note)
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH * 1.3, 3.6), squeeze=False)
    ax = axes[0][0]
    d = paired[paired["metric"] == "tpot_p50"]
    for (prop, k), g in d.sort_values("rate").groupby(["proposer", "k"]):
        ax.errorbar(g["rate"], g["speedup"], yerr=_err(g, "speedup"), marker="o", capsize=3,
                    color=PROPOSER_COLORS.get(prop, "tab:gray"), label=f"{prop} k={k}")
    ax.axhline(1.0, color="k", lw=1, ls="--")
    ax.set_xscale("log")
    rates = sorted(d["rate"].unique())
    ax.set_xticks(rates)
    ax.set_xticklabels([f"{r:g}" for r in rates])
    ax.minorticks_off()
    ax.set(xlabel="request rate (requests/s, Poisson)", ylabel="no-SD / SD median time per token",
           title="served (continuous batching)")
    ax.legend(fontsize=6)
    ax = axes[0][1]
    if static.empty:
        ax.axis("off")
        ax.text(0.5, 0.5, "no vLLM static-batch cells at this k", ha="center", va="center", fontsize=7,
                transform=ax.transAxes)
    else:
        for (prop, k), g in static.sort_values("batch").groupby(["proposer", "k"]):
            ax.errorbar(g["batch"], g["speedup"], yerr=_err(g, "speedup"), marker="s", capsize=3,
                        color=PROPOSER_COLORS.get(prop, "tab:gray"), label=f"{prop} k={k}")
        ax.axhline(1.0, color="k", lw=1, ls="--")
        _log2_batch(ax, static["batch"])
        ax.set(xlabel="batch size (sequences)", ylabel="decode-throughput speedup",
               title="static batches (batch study, vLLM)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


# -- claims -----------------------------------------------------------------------------------------------------
VERDICT_COLORS = {"reproduced": "tab:green", "not reproduced": "tab:red", "not measurable here": "tab:gray"}


# -- bench study --------------------------------------------------------------------------------------------------
@plot("our engine vs transformers ({profile}); blue: generate, orange: assisted generation", size=(WIDTH, 3.4))
def bench_vs_hf(ax, bn: pd.DataFrame, profile: str):
    """HF time / our time per cell with 95% CI; dashed line is the goal (1.0: ours at least as fast)."""
    labels = [f"bs{r.batch} k{r.k}" for r in bn.itertuples()]
    ax.bar(labels, bn["hf_over_ours"], yerr=_err(bn, "hf_over_ours"), capsize=3,
           color=["tab:blue" if k == 0 else "tab:orange" for k in bn["k"]])
    for goal in sorted(set(bn["goal"])):
        ax.axhline(goal, ls="--", c="grey", lw=1)
    ax.set(ylabel="HF seconds / our seconds")


# -- validation study -----------------------------------------------------------------------------------------------
def validation_scatter(val: pd.DataFrame, profile: str, note: str = "", reference: str = "measured"):
    """Predicted vs reference speedup per cell (measured batch-study cells, or the paper's simulator);
    the diagonal is a perfect prediction."""
    val = val.dropna(subset=["predicted"]) if len(val) else val
    return _scatter(val, profile, note, reference=reference)


@plot("predicted vs reference speedup ({profile})", size=(4.8, 4.4), legend=False,
      empty=lambda v: "" if len(v) else "no cell could be predicted (missing acceptance traces?)")
def _scatter(ax, val: pd.DataFrame, profile: str, reference: str):
    sns.scatterplot(data=val, x="measured", y="predicted", hue="batch", style="proposer", palette="viridis",
                    s=60, ax=ax)
    lo = min(val["measured"].min(), val["predicted"].min()) * 0.9
    hi = max(val["measured"].max(), val["predicted"].max()) * 1.1
    ax.plot([lo, hi], [lo, hi], ls="--", c="grey", lw=1)
    ax.axhline(1, c="k", lw=0.5)
    ax.axvline(1, c="k", lw=0.5)
    ax.set(xlabel=f"{reference} speedup", ylabel="predicted speedup",
           title=f"predicted vs {reference} speedup ({profile})\nMAPE {val['abs_pct_err'].mean():.1f}%")


@plot("policies ({profile}): bars predicted, diamonds measured (where that k was measured)", size=(WIDTH, 3.6),
      legend={"title": None})
def validation_policy(ax, pol: pd.DataFrame, profile: str):
    """Speedup of SD off / fixed k / adaptive k per batch size: predicted (bars) and measured (points)."""
    order = sorted(pol["batch"].unique())
    sns.barplot(data=pol, x="batch", y="predicted", hue="policy", order=order, ax=ax, alpha=0.6)
    meas = pol.dropna(subset=["measured"])
    if not meas.empty:
        sns.stripplot(data=meas, x="batch", y="measured", hue="policy", order=order, dodge=True, marker="D",
                      color="k", size=6, ax=ax, legend=False)
    ax.axhline(1, c="k", lw=0.8, ls="--")
    ax.set(xlabel="batch size", ylabel="speedup over no SD")


@plot("the paper's measured speedups (H100, vLLM) vs our prediction and its simulator", size=(WIDTH, 4.0),
      legend={"ncol": 2})
def paper_measured(ax, df: pd.DataFrame, profile: str):
    """Speedup vs batch size per dataset x proposer: measured by the paper (solid, points), predicted by our
    model (dashed), the paper's simulator (dotted). The same for every profile: the paper's own setting."""
    for i, ((ds, prop), g) in enumerate(df.sort_values("batch").groupby(["dataset", "proposer"])):
        c = f"C{i}"
        ax.plot(g["batch"], g["measured"], "o-", c=c, label=f"{ds} {prop}: measured")
        ax.plot(g["batch"], g["predicted"], "--", c=c, label=f"{ds} {prop}: ours")
        ax.plot(g["batch"], g["simulator"], ":", c=c, label=f"{ds} {prop}: simulator")
    ax.set_xscale("log", base=2)
    ax.axhline(1, c="k", lw=0.8, ls="--")
    ax.set(xlabel="batch size", ylabel="speedup over no SD (k=3)",
           title=f"paper's measured speedups vs ours / its simulator\nMAPE ours {df['abs_pct_err_predicted'].mean():.1f}%, "
                 f"simulator {df['abs_pct_err_simulator'].mean():.1f}%")


def decision_map(grid: pd.DataFrame, pts: pd.DataFrame, profile: str, note: str = ""):
    """Predicted best SD speedup over batch size (log2) x i.i.d. acceptance alpha, the break-even contour
    (speedup 1), and the measured draft-model / EAGLE cells on top, coloured on the same scale (circles: torch
    engine, squares: vLLM; triangles: EAGLE head). A point whose colour differs from the map under it is a
    cell where model and measurement disagree."""
    title = f"decision map: where SD pays ({profile})"
    if grid.empty:
        return placeholder(title, note)
    from matplotlib.colors import TwoSlopeNorm
    fig, ax = plt.subplots(figsize=(WIDTH, 4.4))
    piv = grid.pivot(index="alpha", columns="batch", values="speedup")
    x, y = np.log2(piv.columns.to_numpy(float)), piv.index.to_numpy(float)
    vals = [piv.to_numpy(float)] + ([pts["speedup"].to_numpy(float)] if len(pts) else [])
    lo, hi = (float(np.nanmin(np.concatenate([v.ravel() for v in vals]))),
              float(np.nanmax(np.concatenate([v.ravel() for v in vals]))))
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.95), vmax=max(hi, 1.05))
    mesh = ax.pcolormesh(x, y, piv.to_numpy(float), cmap="RdBu", norm=norm, shading="nearest")
    cs = ax.contour(x, y, piv.to_numpy(float), levels=[1.0], colors="k", linewidths=1.2)
    ax.clabel(cs, fmt="break-even", fontsize=6)
    fig.colorbar(mesh, ax=ax, label="speedup (best k in 1..8)")
    for (eng, prop), g in (pts.groupby(["engine", "proposer"]) if len(pts) else []):
        marker = "^" if prop.startswith("eagle") else ENGINE_MARKERS.get(eng, "o")
        jitter = {"torch": -0.08, "vllm": 0.08}.get(eng, 0.0) + (0.16 if prop.startswith("eagle") else 0.0)
        ax.scatter(np.log2(g["batch"].to_numpy(float)) + jitter, g["alpha"], c=g["speedup"], cmap="RdBu",
                   norm=norm, marker=marker, s=46, edgecolors="k", linewidths=0.8, label=f"measured: {prop}, {eng}")
    ax.set_xticks(x)
    ax.set_xticklabels([str(int(b)) for b in piv.columns])
    ax.set(xlabel="batch size (sequences)", ylabel="i.i.d. acceptance alpha (measured cells: from tokens/step)",
           title=title)
    if len(pts):
        ax.legend(fontsize=6, loc="lower left")
    if note:
        ax.text(0.0, -0.2, note[:220], transform=ax.transAxes, fontsize=5, va="top")
    fig.tight_layout()
    return fig


def claims_verdicts(df: pd.DataFrame, profile: str):
    """One line per claim: the verdict (colour) and the measured number with its 95% CI where numeric."""
    fig, ax = plt.subplots(figsize=(WIDTH * 1.8, 0.4 * len(df) + 1.0))
    y = np.arange(len(df))
    for i, r in enumerate(df.itertuples()):
        color = VERDICT_COLORS.get(r.verdict, "k")
        ax.text(0.0, i, f"{r.claim}: {r.statement}", va="center", fontsize=7)
        ax.text(0.62, i, r.verdict, va="center", fontsize=7, color=color, weight="bold")
        text = r.measured_text if len(r.measured_text) < 70 else r.measured_text[:67] + "..."
        ax.text(0.80, i, text, va="center", fontsize=6)
    ax.set_ylim(len(df) - 0.5, -0.5)
    ax.set_xlim(0, 1.45)
    ax.set_yticks(y)
    ax.set_yticklabels([])
    ax.axis("off")
    ax.set_title(f"claims of arXiv 2601.11580 checked on profile '{profile}'")
    fig.tight_layout()
    return fig
