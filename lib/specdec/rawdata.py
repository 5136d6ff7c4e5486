"""Raw-data folders: data/raw/<profile>/<study>/<run-id>/ with parquet tables and meta.json written last.

A folder without a readable meta.json whose status is "complete" is partial: it is reported, never loaded.
Tables: requests.parquet (one row per request), steps.parquet (one row per engine step),
batches.parquet (one row per static batch), forwards.parquet (forward-mode cells: one row per timed
forward pass of target or draft), bench.parquet (hf-mode cells: our engine vs HF generate). Times are seconds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from . import paths
from .errors import SpecdecError

TABLES = ("requests", "steps", "batches", "forwards", "bench")


def run_dir(profile: str, study: str, run_id: str) -> Path:
    return paths.raw_root() / profile / study / run_id


def read_meta(folder: Path) -> dict | None:
    """The meta dict of a complete run, else None."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return meta if meta.get("status") == "complete" else None


def is_complete(folder: Path) -> bool:
    return read_meta(folder) is not None


def git_state() -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=paths.root(), capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "HEAD") or "unknown", "dirty": bool(git("status", "--porcelain", "lib"))}


def versions() -> dict:
    import numpy
    import torch
    import transformers

    out = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
           "numpy": numpy.__version__, "pandas": pd.__version__}
    try:
        from importlib.metadata import version
        out["specdec"] = version("specdec")
        out["vllm"] = version("vllm")
    except Exception:
        pass
    return out


def write_run(folder: Path, tables: dict[str, pd.DataFrame], meta: dict) -> None:
    """Write tables, then meta.json (atomically, last). Refuses to touch a complete run."""
    if is_complete(folder):
        raise SpecdecError(f"refusing to overwrite complete run {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        df.to_parquet(folder / f"{name}.parquet", index=False)
    meta = dict(meta, status="complete", finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    tmp = folder / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
    os.replace(tmp, folder / "meta.json")


def set_aside_partial(folder: Path) -> Path | None:
    """Move an interrupted run out of the way (kept, renamed), so a resume can redo it."""
    if folder.exists() and not is_complete(folder):
        dest = folder.with_name(f"{folder.name}.partial-{time.strftime('%Y%m%d%H%M%S')}")
        folder.rename(dest)
        return dest
    return None


def scan(profile: str | None = None, study: str | None = None) -> tuple[list[Path], list[Path]]:
    """(complete run folders, partial ones) under data/raw, optionally for one profile/study."""
    base = paths.raw_root()
    pattern = f"{profile or '*'}/{study or '*'}/*"
    complete, partial = [], []
    for folder in sorted(base.glob(pattern)):
        if folder.is_dir():
            (complete if is_complete(folder) else partial).append(folder)
    return complete, partial


_HASHES: dict = {}


def _current(meta: dict, study: str) -> bool:
    """Was this run measured under the study config as it is now (for its profile)?"""
    from . import config

    key = (study, meta.get("profile"))
    if key not in _HASHES:
        try:
            _HASHES[key] = config.config_hash(config.load_study(study, meta.get("profile")))
        except SpecdecError:
            _HASHES[key] = None
    return _HASHES[key] is None or meta.get("config_sha256") == _HASHES[key]


def load(study: str, profile: str | None = None, table: str = "requests", warn=print) -> pd.DataFrame:
    """One table of every complete run of a study, with the run's cell and profile as columns.

    Partial runs are reported through `warn` and skipped, and so are runs measured under an older version
    of the study config (config_sha256 differs); no complete run is a one-line error."""
    if table not in TABLES:
        raise SpecdecError(f"unknown raw table '{table}'; known: {', '.join(TABLES)}")
    complete, partial = scan(profile, study)
    for folder in partial:
        warn(f"skipping partial or corrupt run {folder} (no complete meta.json)")
    frames, stale = [], 0
    for folder in complete:
        meta = read_meta(folder)
        if not _current(meta, study):
            stale += 1
            continue
        path = folder / f"{table}.parquet"
        if not path.exists():
            continue
        try:
            df = pd.read_parquet(path)
        except Exception as e:  # a corrupt parquet file: report, do not load
            warn(f"skipping corrupt run {folder}: {type(e).__name__}")
            continue
        for key, val in meta["cell"].items():
            df[key] = val
        df["profile"], df["run_id"], df["engine"] = meta["profile"], meta["run_id"], meta.get("engine", "torch")
        df["pair"] = meta["config"].get("pair")
        frames.append(df)
    if stale:
        warn(f"ignored {stale} run(s) of {study} measured under an older config (different config_sha256)")
    if not frames:
        where = f"data/raw/{profile or '*'}/{study}"
        raise SpecdecError(f"no complete raw runs in {where} (run `make measure GPU=...` or use the fixture)")
    return pd.concat(frames, ignore_index=True)
