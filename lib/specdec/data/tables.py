"""Processed tables: the raw runs of a study, from either engine, in one schema (the layer between data/raw
and every analysis, prediction, claim and figure; nothing above it reads raw folders or knows an engine).

`python -m specdec tables --gpu G` writes build/<profile>/tables/<study>/<name>.parquet and a manifest.json
naming the raw runs they came from (run ids and sha256 of their meta.json). `load()` reads those files when
the manifest matches data/raw as it is now, and otherwise builds the tables from raw in memory, so a stale
build/ can never be read.

Tables (one row per ...), with run keys (profile, engine, pair, run_id) and the cell keys (config.py) on
every row except `runs`:
  runs       complete run of the study's current config: run keys, cell keys, config_sha256, has_steps,
             finished (keep/retire) and verify (k/proposed/ragged): what the engine did (spec.TorchEngine),
             drafts / drafted_tokens / accepted_tokens (vLLM's spec-decode counters over the timed SD calls),
             started, probe_before_gbs / probe_after_gbs (probe.py: read bandwidth around the run, GB/s)
  batches    timed static batch: repeat, batch_idx, arm ("cell", or "base": the interleaved no-SD twin of a
             paired cell), pair_idx (the raw column `pair`: index of the interleaved pair), size, steps, decode_tokens, decode_s (s, prefill excluded for both
             engines), prefill_s, cpu_util, same_as_base (vLLM: share of sequences whose tokens equal
             the other arm's), step_s/draft_s/verify_s/other_s/engine_steps (vLLM in-process), ...
  requests   request: prompt_set, prompt_idx, new_tokens, arrival_s/admitted_s/first_token_s/finish_s (s)
  steps      engine step (torch engine only): draft_s, verify_s, other_s (s), per-sequence lists accepted,
             proposed, active, rids
  forwards   timed forward pass (hardware study): model, batch, query, context, tokens, seconds
  bench      ours-vs-transformers call (bench study): impl, repeat, batch_idx, seconds, same_output
  windows    load window of a serve cell (serving study, serving.py): arm, pair_idx, window, tokens,
             duration_s, tok_s, req_s and the loaded server's spec-decode counter deltas
  lengths    accept-length histogram per acceptance unit: length (draft tokens accepted by one step, 0..k),
             count (steps)
  positions  acceptance counts per unit and draft position (1..k): tried, accepted, proposed

Acceptance units: a request (repeat, batch_idx, rid) for the torch engine, which traces every step; the whole
run (unit "all", prompt_set "all") for vLLM, whose counters are aggregate. Bootstrap intervals resample units.

The one acceptance definition: a step *tries* position j when j <= k and its first j-1 draft tokens were
accepted, and *accepts* it when its first j were. A position the proposer left empty (n-gram lookup
proposing fewer than k) is tried and rejected: that is what happens to the step's throughput, what predicts
tokens per step at any k' <= k (acceptance.py), and what vLLM's counters imply (tried at j = accepted at
j-1). `proposed` counts tried positions that held a real token (n-gram coverage; unknown, NaN, for vLLM).
vLLM counts only steps that proposed something (num_drafts); the torch engine counts every step.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from .. import paths
from ..errors import SpecdecError
from . import config as cfgmod
from . import rawdata
from .spec import TorchEngine

RAW = ("batches", "requests", "steps", "forwards", "bench", "windows")
DERIVED = ("lengths", "positions")
NAMES = ("runs",) + RAW + DERIVED
RUN_KEYS = ["profile", "engine", "pair", "run_id"]
CELL_KEYS = list(cfgmod.GRID_KEYS)
UNIT_KEYS = ["repeat", "batch_idx", "rid"]
_FLOAT_KEYS = ("alpha", "rate", "context", "requests")
_TEXT_KEYS = ("mode", "proposer", "quant", "profile", "engine", "run_id", "pair", "trace")
# Bumped when the tables' columns change, so tables written by older code are rebuilt rather than read
# (2: the cell key `trace`, the replayed dataset; 3: the serving study's `windows`; 4: runs' `finished`;
# 5: runs' `verify`, `drafts`, `drafted_tokens`, `accepted_tokens`).
SCHEMA = 5

_warned: set[str] = set()


_quiet = []


def _warn(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        if not _quiet:
            print(f"warning: {msg}", file=sys.stderr)


class quiet:
    """Within: reading warnings are recorded, not printed (a side note such as advise's certainty line)."""

    def __enter__(self):
        _quiet.append(1)

    def __exit__(self, *exc):
        _quiet.pop()


def folder(profile: str, study: str) -> Path:
    return paths.build_root() / profile / "tables" / study


def _where(profile: str, study: str) -> str:
    f = paths.raw_root() / profile / study
    try:
        return str(f.relative_to(paths.root()))
    except ValueError:
        return str(f)


def _check(profile: str, study: str, name: str | None = None) -> None:
    if not profile:
        raise SpecdecError("no hardware profile given (profile=...), e.g. 'cpu' or 'fixture'")
    if study not in cfgmod.study_names():
        raise SpecdecError(f"unknown study '{study}'; known: {', '.join(cfgmod.study_names())}")
    if name is not None and name not in NAMES:
        raise SpecdecError(f"unknown table '{name}'; known: {', '.join(NAMES)}")


def signature(profile: str, study: str) -> tuple[str, tuple, str]:
    """What the tables are built from: (raw root, ((run folder, sha256 of its meta.json), ...) of every
    complete run, the selection). The same run names under another raw root are other runs; the selection is
    the config hashes whose runs count as current (rawdata._current_hash, both engines), so an edited config
    (a promoted torch_next) or the staged preview (SPECDEC_STAGED) rebuilds the tables."""
    complete, partial, bad = rawdata.scan_all(profile, study)
    for f in partial:
        _warn(f"skipping partial run {f} (no complete meta.json)")
    for f, why in bad:
        _warn(f"skipping CORRUPT run {f}: {why}; results of study '{study}' lack it (move it to data/set-aside/ "
              f"and re-measure the cell)")
    runs_ = []
    for f in complete:
        try:
            st = (f / "meta.json").stat()
            runs_.append((f.name, _meta_sha(str(f / "meta.json"), st.st_mtime_ns, st.st_size)))
        except OSError:
            pass
    selection = " ".join(f"{e}:{(rawdata._current_hash(study, profile, e) or '-')[:12]}" for e in ("torch", "vllm"))
    return str(paths.raw_root()), tuple(runs_), selection


@lru_cache(maxsize=4096)
def _meta_sha(path: str, mtime_ns: int, size: int) -> str:
    """sha256 of a meta.json, read again only when the file changes (every load() asks for the signature)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- normalisation -----------------------------------------------------------------------------------------
def _normalise(df: pd.DataFrame) -> pd.DataFrame:
    """Cell keys typed the same way for every engine: floats (NaN = unset), text (None = unset)."""
    df = df.copy()
    for key in _FLOAT_KEYS:
        df[key] = pd.to_numeric(df[key], errors="coerce").astype(float) if key in df else np.nan
    if "trace" not in df:  # runs from before the cell key: no replayed dataset
        df["trace"] = None
    for key in _TEXT_KEYS:
        if key in df:
            df[key] = df[key].astype(object).where(df[key].notna(), None)
    if "mode" in df:
        df["mode"] = df["mode"].fillna("static")
    if "quant" in df:
        df["quant"] = df["quant"].fillna("none")
    if "temperature" in df:
        df["temperature"] = pd.to_numeric(df["temperature"], errors="coerce").astype(float)
    return df.reset_index(drop=True)


def _probe(meta: dict, when: str) -> float:
    try:
        return float(meta["probe"][when]["read_gbs"])
    except (KeyError, TypeError, ValueError):
        return np.nan


# What vLLM does where the torch engine has a setting (spec.TorchEngine): its scheduler drops a finished request,
# and it verifies each request's own proposal.
_VLLM_DOES = {"finished": "retire", "verify": "ragged"}


def _engine_does(meta: dict, key: str) -> str:
    """What a run's engine did for the spec.TorchEngine setting `key` ("finished": keep/retire, "verify":
    k/proposed/ragged): vLLM's own behaviour, else the run's torch config, or TorchEngine's default where the
    config predates the key."""
    if meta.get("engine", "torch") != "torch":
        return _VLLM_DOES[key]
    return str((meta.get("config", {}).get("torch") or {}).get(key, getattr(TorchEngine, key)))


def _counters(meta: dict) -> dict:
    """A vLLM run's spec-decode counters over its timed SD calls (meta.json `acceptance`): drafts (request-steps
    that proposed), drafted_tokens and accepted_tokens (NaN for the torch engine, whose steps table has them per
    step)."""
    acc = meta.get("acceptance") or {}
    return {"drafts": float(acc.get("num_drafts", np.nan)),
            "drafted_tokens": float(acc.get("num_draft_tokens", np.nan)),
            "accepted_tokens": float(acc.get("num_accepted_tokens", np.nan))}


def _runs(metas: list[tuple[Path, dict]]) -> pd.DataFrame:
    rows = [{"profile": m["profile"], "engine": m.get("engine", "torch"), "pair": m["config"].get("pair"),
             "run_id": m["run_id"], **{k: m["cell"].get(k) for k in CELL_KEYS},
             "config_sha256": m.get("config_sha256"), "has_steps": (f / "steps.parquet").exists(),
             "finished": _engine_does(m, "finished"), "verify": _engine_does(m, "verify"), **_counters(m),
             "started": m.get("started"), "probe_before_gbs": _probe(m, "before"),
             "probe_after_gbs": _probe(m, "after")}
            for f, m in metas]
    return _normalise(pd.DataFrame(rows))


def _same_as_base(df: pd.DataFrame) -> pd.Series:
    """Per batch row: the fraction of its sequences whose tokens equal the same sequence's in the other arm of
    its pair (vLLM runs record output_ids); NaN where there is nothing to compare."""
    out = pd.Series(np.nan, index=df.index)
    if "output_ids" not in df:
        return out
    for _, g in df[df["output_ids"].notna()].groupby(["run_id", "pair_idx"]):
        if set(g["arm"]) != {"cell", "base"}:
            continue
        a, b = (list(g.loc[g["arm"] == arm, "output_ids"].iloc[0]) for arm in ("cell", "base"))
        same = np.mean([list(x) == list(y) for x, y in zip(a, b)]) if len(a) == len(b) and len(a) else np.nan
        out[g.index] = same
    return out


def _batches(df: pd.DataFrame) -> pd.DataFrame:
    """Runs from before pairing have no `arm`: all their batches are the cell's own ("cell"). vLLM's output_ids
    become same_as_base (fraction of sequences identical in both arms of the pair) and are dropped."""
    df = df.copy()
    df["arm"] = df["arm"].fillna("cell") if "arm" in df else "cell"
    if "pair_idx" not in df:
        df["pair_idx"] = np.nan
    df["same_as_base"] = _same_as_base(df)
    return df.drop(columns=["output_ids"], errors="ignore")


# -- acceptance: one definition ------------------------------------------------------------------------------
def position_counts(length: np.ndarray, k: int, proposed: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-position counts (arrays of k) from accept lengths n (one per step) under the one definition:
    tried[j] = #(n >= j-1), accepted[j] = #(n >= j); proposed[j] = #(tried at j and >= j real tokens)."""
    n = np.asarray(length, int)[:, None]
    pos = np.arange(1, k + 1)[None, :]
    tried = n >= pos - 1
    out = {"tried": tried.sum(0), "accepted": (n >= pos).sum(0)}
    if proposed is not None:
        out["proposed"] = (tried & (np.asarray(proposed, int)[:, None] >= pos)).sum(0)
    else:
        out["proposed"] = np.full(k, np.nan)
    return out


def _unit_frames(keys: dict, unit: dict, k: int, length: np.ndarray, proposed) -> tuple[list, list]:
    vals, counts = np.unique(np.asarray(length, int), return_counts=True)
    lengths = [{**keys, **unit, "length": int(v), "count": int(c)} for v, c in zip(vals, counts)]
    pc = position_counts(length, k, proposed)
    positions = [{**keys, **unit, "position": j + 1, "tried": int(pc["tried"][j]),
                  "accepted": int(pc["accepted"][j]), "proposed": pc["proposed"][j]} for j in range(k)]
    return lengths, positions


def _from_steps(steps: pd.DataFrame, requests: pd.DataFrame | None) -> tuple[list, list]:
    """Torch engine: one unit per request, from the active entries of speculative steps."""
    s = steps[(steps["k"] > 0) & (steps["mode"] != "forward")]
    if s.empty:
        return [], []
    e = s[RUN_KEYS + CELL_KEYS + ["repeat", "batch_idx", "accepted", "proposed", "active", "rids"]].explode(
        ["accepted", "proposed", "active", "rids"])
    e = e[e["active"].astype(bool)].rename(columns={"rids": "rid"})
    e = e.astype({"accepted": int, "proposed": int, "rid": int})
    if requests is not None and len(requests):
        r = requests[["run_id"] + UNIT_KEYS + ["prompt_set", "prompt_idx"]]
        e = e.merge(r, on=["run_id"] + UNIT_KEYS, how="left")
    else:
        e["prompt_set"], e["prompt_idx"] = None, np.nan
    e["prompt_set"] = e["prompt_set"].astype(object).fillna("unknown")
    lengths, positions = [], []
    group = RUN_KEYS + UNIT_KEYS
    for _, g in e.groupby(group, sort=False):
        first = g.iloc[0]
        keys = {c: first[c] for c in RUN_KEYS + CELL_KEYS}
        unit = {**{c: first[c] for c in UNIT_KEYS}, "prompt_set": first["prompt_set"],
                "prompt_idx": first["prompt_idx"]}
        lo, po = _unit_frames(keys, unit, int(first["k"]), g["accepted"].to_numpy(), g["proposed"].to_numpy())
        lengths += lo
        positions += po
    return lengths, positions


def _from_counters(metas: list[tuple[Path, dict]]) -> tuple[list, list]:
    """vLLM: one unit per run, from acceptance.json (num_drafts, num_accepted_tokens_per_pos)."""
    lengths, positions = [], []
    for f, m in metas:
        path = f / "acceptance.json"
        k = int(m["cell"].get("k") or 0)
        if (f / "steps.parquet").exists() or not path.exists() or k == 0:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            _warn(f"unreadable {path}")
            continue
        drafts = int(data.get("num_drafts") or 0)
        per_pos = [int(x) for x in data.get("num_accepted_tokens_per_pos", [])][:k]
        if not drafts:
            continue
        per_pos += [0] * (k - len(per_pos))
        at_least = np.array([drafts] + per_pos + [0])  # steps accepting >= j tokens, j = 0..k+1
        length = np.repeat(np.arange(k + 1), at_least[:-1] - at_least[1:])
        keys = {"profile": m["profile"], "engine": m.get("engine", "vllm"), "pair": m["config"].get("pair"),
                "run_id": m["run_id"], **{c: m["cell"].get(c) for c in CELL_KEYS}}
        unit = {"repeat": np.nan, "batch_idx": np.nan, "rid": np.nan, "prompt_set": "all", "prompt_idx": np.nan}
        lo, po = _unit_frames(keys, unit, k, length, None)
        lengths += lo
        positions += po
    return lengths, positions


# -- build, write, load ----------------------------------------------------------------------------------------
def build(profile: str, study: str) -> dict[str, pd.DataFrame]:
    """Every table of a study on a profile, built from data/raw now (tables no run has are left out)."""
    _check(profile, study)
    return dict(_build_cached(profile, study, signature(profile, study)))


@lru_cache(maxsize=32)
def _build_cached(profile: str, study: str, sig: tuple) -> tuple:
    if not sig[1]:
        raise SpecdecError(f"no complete raw runs of study '{study}' for profile '{profile}' in "
                           f"{_where(profile, study)} (measure first: python -m specdec measure --study {study} "
                           f"--gpu {profile})")
    metas = rawdata.current_runs(study, profile, warn=lambda m: _warn(m) if "older config" in m else None)
    out = {"runs": _runs(metas)}
    for name in RAW:
        try:
            out[name] = _normalise(rawdata.load(study, profile, name, warn=lambda _m: None))
        except SpecdecError:
            continue
    if "batches" in out:
        out["batches"] = _batches(out["batches"])
    lt, pt = _from_counters(metas)
    ls, ps = _from_steps(out["steps"], out.get("requests")) if "steps" in out else ([], [])
    if lt or ls:
        out["lengths"] = _normalise(pd.DataFrame(ls + lt))
        out["positions"] = _normalise(pd.DataFrame(ps + pt))
    return tuple(out.items())


def write(profile: str, studies: list[str] | None = None, echo=print) -> list[Path]:
    """Write every table of each study that has raw runs on `profile` (all of them, or `studies`); returns the
    manifest paths (none for a profile without raw runs: its views are predicted)."""
    for study in studies or []:
        _check(profile, study)
    found = {s: rawdata.scan_all(profile, s) for s in (studies or cfgmod.study_names())}
    bad = [b for _, _, corrupt in found.values() for b in corrupt]
    names = [s for s, (complete, _, _) in found.items() if studies or complete]
    if bad:  # refuse: tables (and every verdict built on them) would silently lack these cells
        raise SpecdecError(f"{len(bad)} corrupt raw run(s), first {bad[0][0]}: {bad[0][1]}; move them out of "
                           f"data/raw (e.g. to data/set-aside/) and re-measure (`specdec status` lists them)")
    if not names:
        echo(f"no raw runs for profile '{profile}' under {paths.raw_root() / profile}: nothing to tabulate")
    written = []
    for study in names:
        sig = signature(profile, study)
        out = folder(profile, study)
        manifest = out / "manifest.json"
        if _manifest_matches(manifest, sig):
            written.append(manifest)
            continue
        tabs = build(profile, study)
        _replace_folder(out, tabs, {"gpu": profile, "study": study, "schema": SCHEMA, "raw_root": sig[0],
                                    "selection": sig[2],
                                    "runs": [list(r) for r in sig[1]], "tables": sorted(tabs)})
        echo(f"{study}: {', '.join(f'{n} ({len(d)})' for n, d in tabs.items())} -> {out}")
        written.append(manifest)
    return written


def _replace_folder(out: Path, tabs: dict, manifest: dict) -> None:
    """Write a study's tables into a fresh sibling folder, then swap it in by renames: a concurrent reader or
    writer (two `specdec tables` at once) sees the old folder or the new one, never a half-written one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    for name, df in tabs.items():
        df.to_parquet(tmp / f"{name}.parquet", index=False)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    try:
        os.replace(out, old / "tables")  # may be absent on a first write
    except FileNotFoundError:
        pass
    try:
        os.replace(tmp, out)
    except OSError:  # another writer got there first with the same inputs: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def _manifest_matches(manifest: Path, sig: tuple) -> bool:
    try:
        m = json.loads(manifest.read_text())
        return m.get("schema") == SCHEMA and (m["raw_root"], tuple(tuple(r) for r in m["runs"]),
                                              m.get("selection")) == sig
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return False


def _tables(profile: str, study: str) -> dict:
    """Every table of a study: from build/ when its manifest matches data/raw, else built now (cached)."""
    sig = signature(profile, study)
    tabs = _read_cached(str(folder(profile, study)), sig) if sig[1] else None
    return tabs if tabs is not None else dict(_build_cached(profile, study, sig))


def names(profile: str, study: str) -> list[str]:
    """The tables the runs of a study have (a profile without runs is a one-line SpecdecError)."""
    _check(profile, study)
    return sorted(_tables(profile, study))


def load(profile: str, study: str, name: str) -> pd.DataFrame:
    """One processed table (a copy): from build/ when it matches data/raw, else built now. A table no run of
    the study has is a one-line SpecdecError that says why."""
    _check(profile, study, name)
    tabs = _tables(profile, study)
    if name not in tabs:
        engines = set(tabs["runs"]["engine"])
        why = " (vLLM runs record no per-step traces)" if name == "steps" and "vllm" in engines else ""
        raise SpecdecError(f"the runs of study '{study}' on profile '{profile}' have no '{name}' table{why}")
    return tabs[name].copy()


@lru_cache(maxsize=32)
def _read_cached(where: str, sig: tuple) -> dict | None:
    out = Path(where)
    if not _manifest_matches(out / "manifest.json", sig):
        return None
    try:
        return {p.stem: pd.read_parquet(p) for p in out.glob("*.parquet")}
    except OSError:  # swapped out by a concurrent `tables` write: build in memory instead
        return None


def pair_sums(g: pd.DataFrame) -> pd.DataFrame:
    """One paired run's batches (arm cell/base, pair_idx) summed per interleaved pair: decode tokens and seconds of
    each arm (columns decode_tokens_c, decode_s_c, decode_tokens_b, decode_s_b), one row per pair both arms ran."""
    cell, base = (g[g["arm"] == a].groupby("pair_idx")[["decode_tokens", "decode_s"]].sum() for a in ("cell", "base"))
    return cell.add_suffix("_c").join(base.add_suffix("_b"), how="inner")


def runs(profile: str, study: str) -> pd.DataFrame:
    """The `runs` table: one row per complete run of the study's current config."""
    return load(profile, study, "runs")


def profiles(study: str | None = None) -> list[str]:
    """Profiles that have at least one complete run (of `study`, if given)."""
    complete, _ = rawdata.scan(None, study)
    return sorted({f.parent.parent.name for f in complete})


def has_runs(profile: str, study: str) -> bool:
    return bool(rawdata.scan(profile, study)[0])
