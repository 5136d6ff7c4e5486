"""Raw-data folders: data/raw/<profile>/<study>/<run-id>/ with parquet tables and meta.json written last.

A folder without a readable meta.json whose status is "complete" is partial: it is reported, never loaded.
Tables: requests.parquet (one row per request), steps.parquet (one row per engine step),
batches.parquet (one row per static batch), forwards.parquet (forward-mode cells: one row per timed
forward pass of target or draft), bench.parquet (hf-mode cells: our engine vs HF generate), windows.parquet (serve cells: one row per load
window, serving.py). Times are seconds.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from .. import paths
from ..errors import SpecdecError

TABLES = ("requests", "steps", "batches", "forwards", "bench", "windows")


def run_dir(profile: str, study: str, run_id: str) -> Path:
    return paths.raw_root() / profile / study / run_id


def read_meta(folder: Path) -> dict | None:
    """The meta dict of a run whose meta.json says it is complete, else None (no meta.json, not JSON, not a
    mapping, or another status: a partial run)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return meta if isinstance(meta, dict) and meta.get("status") == "complete" else None


def is_complete(folder: Path) -> bool:
    """Whether the run's meta.json says complete: such a folder is never overwritten or set aside, even when
    it is corrupt (see problem)."""
    return read_meta(folder) is not None


META_KEYS = {"run_id": str, "profile": str, "cell": dict, "config": dict}  # what loading a run reads


def problem(folder: Path, meta: dict | None = None) -> str | None:
    """Why a run whose meta.json says complete cannot be read (None when it can): meta.json lacking a key
    every run has, or a table file that is not a readable parquet (truncated, overwritten). Such a run is
    corrupt: reported by status, tables, notebooks and goals, never loaded, never silently dropped.
    `meta`: the run's read_meta, when the caller has it already."""
    meta = meta if meta is not None else read_meta(folder)
    if meta is None:
        return "no complete meta.json"
    bad = [k for k, t in META_KEYS.items() if not isinstance(meta.get(k), t)]
    if bad:
        return f"meta.json lacks or mistypes {', '.join(bad)}"
    files = sorted(folder.glob("*.parquet"))
    if not files:
        return "no table files"
    for f in files:
        st = f.stat()
        err = _parquet_problem(str(f), st.st_mtime_ns, st.st_size)
        if err:
            return f"{f.name} unreadable ({err})"
    return None


@functools.lru_cache(maxsize=8192)
def _parquet_problem(path: str, mtime_ns: int, size: int) -> str | None:
    """Why a parquet file's footer and schema cannot be read (None if they can); cached per file version."""
    import pyarrow.parquet as pq

    try:
        pq.ParquetFile(path).schema_arrow
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... for a truncated or foreign file
        return type(e).__name__
    return None


@functools.lru_cache(maxsize=1)
def git_state() -> dict:
    """The commit of the code this process runs, and whether lib/ had uncommitted changes, read once (at the
    first call, before any cell is measured): later edits to the tree do not change what was imported."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=paths.root(), capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "HEAD")
    if not commit and os.environ.get("SPECDEC_COMMIT"):  # a copy of the tree without .git (the device machine)
        return {"commit": os.environ["SPECDEC_COMMIT"], "dirty": None, "from": "SPECDEC_COMMIT"}
    return {"commit": commit or "unknown", "dirty": bool(git("status", "--porcelain", "lib"))}


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


def run_meta(study: str, folder: Path, profile: str, cell: dict, cfg: dict, machine: dict, engine: str,
             device: str, started: str, loadavg_start, versions_: dict | None = None, **extra) -> dict:
    """The meta.json of one finished cell, the same keys for both engines: study, run_id, profile, cell,
    config and its sha256, hardware, versions, git (read once per process), command, engine, device, started
    (local time), loadavg_start/end (1/5/15-minute load averages), plus engine-specific `extra` keys."""
    from . import config

    return {"study": study, "run_id": folder.name, "profile": profile, "cell": cell, "config": cfg,
            "config_sha256": config.config_hash(cfg, engine), "hardware": machine,
            "versions": versions_ if versions_ is not None else versions(), "git": git_state(),
            "command": "python -m specdec " + " ".join(sys.argv[1:]), "engine": engine, "device": device,
            "started": started, "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg(), **extra}


def pending_cells(profile: str, study: str, cells: list[dict], run_id, echo=print, prepare=None,
                  dry_run: bool = False):
    """The resume rule shared by both engines: (pending, unsupported) for a study's cells.

    `run_id(cell)` names the cell's folder. Complete folders are skipped (never overwritten); `prepare(cell)`
    (optional) returns what running the cell needs or raises SpecdecError, which lists the cell as
    unsupported; a folder left by an interrupted run is set aside (renamed, kept) so the cell is redone
    (with `dry_run`, only reported: a dry run changes nothing on disk).
    pending: [(cell, folder, prepared)], unsupported: [(run_id, reason)]."""
    pending, unsupported = [], []
    for cell in cells:
        rid = run_id(cell)
        folder = run_dir(profile, study, rid)
        if is_complete(folder):
            continue
        prepared = None
        if prepare is not None:
            try:
                prepared = prepare(cell)
            except SpecdecError as e:
                unsupported.append((rid, str(e)))
                continue
        if dry_run:
            if folder.exists():
                echo(f"would set aside interrupted run: {folder}")
        else:
            moved = set_aside_partial(folder)
            if moved:
                echo(f"interrupted run set aside: {moved}")
        pending.append((cell, folder, prepared))
    return pending, unsupported


def scan(profile: str | None = None, study: str | None = None) -> tuple[list[Path], list[Path]]:
    """(sound complete run folders, partial ones) under data/raw, optionally for one profile/study.
    Corrupt runs (complete but unreadable, see problem) are in neither: scan_all() lists them."""
    complete, partial, _ = scan_all(profile, study)
    return complete, partial


def scan_all(profile: str | None = None, study: str | None = None) -> tuple[list[Path], list[Path], list]:
    """(sound complete runs, partial runs, [(corrupt run, why)]) under data/raw."""
    base = paths.raw_root()
    pattern = f"{profile or '*'}/{study or '*'}/*"
    complete, partial, bad = [], [], []
    for folder in sorted(base.glob(pattern)):
        if not folder.is_dir():
            continue
        meta = read_meta(folder)
        if meta is None:
            partial.append(folder)
        elif (why := problem(folder, meta)) is not None:
            bad.append((folder, why))
        else:
            complete.append(folder)
    return complete, partial, bad


_HASHES: dict = {}


def _config_stamp(study: str) -> tuple | None:
    """(mtime_ns, size) of the study config file, so that the hash cache follows a changed root
    (SPECDEC_ROOT) or an edited config within one process."""
    path = paths.configs() / f"{study}.yaml"
    return (path.stat().st_mtime_ns, path.stat().st_size) if path.exists() else None


PREVIEW_ENV = "SPECDEC_STAGED"  # "1": analysis reads a profile's staged torch runs as if torch_next were promoted


def _current_hash(study: str, profile: str | None, engine: str = "torch") -> str | None:
    """config_sha256 of the study config as it is now for `profile` and `engine` (None if it cannot be loaded).
    With SPECDEC_STAGED=1 in the environment, the torch engine's current hash is the staged one where the
    profile stages torch_next (a preview of the promotion on whatever staged cells exist; the config is untouched)."""
    from . import config

    staged = _staged_hash(study, profile) if engine == "torch" and os.environ.get(PREVIEW_ENV) == "1" else None
    if staged:
        return staged

    key = (str(paths.configs()), _config_stamp(study), study, profile, engine)
    if key not in _HASHES:
        try:
            _HASHES[key] = config.config_hash(config.load_study(study, profile), engine)
        except SpecdecError:
            _HASHES[key] = None
    return _HASHES[key]


def _staged_hash(study: str, profile: str | None) -> str | None:
    """config_sha256 the torch engine's runs get under the config's staged torch_next (config.next_view), or
    None when the profile stages none."""
    from . import config

    key = (str(paths.configs()), _config_stamp(study), study, profile, "torch_next")
    if key not in _HASHES:
        try:
            cfg = config.load_study(study, profile)
            _HASHES[key] = config.config_hash(config.next_view(cfg), "torch") if cfg.get("torch_next") else None
        except SpecdecError:
            _HASHES[key] = None
    return _HASHES[key]


def staged_progress(study: str, profile: str) -> tuple[int, int] | None:
    """(cells measured, cells in the grid) of the torch engine under a profile's staged torch_next
    (config.next_view; `measure --next`), or None when the profile stages nothing for the study."""
    from . import config

    cfg = config.load_study(study, profile)
    if not cfg.get("torch_next"):
        return None
    view = config.next_view(cfg)  # a torch_next it refuses is a one-line error here
    chash = config.config_hash(view)
    names = {config.run_name(c, chash) for c in config.cells(view)}
    return len(names & {p.name for p in scan(profile, study)[0]}), len(names)


def _keep_current(metas: list[dict], study: str, warn) -> list[bool]:
    """Per profile: when some runs match the current config hash (of their own engine's view of the config,
    config.config_hash), keep only those (older-config runs are reported and ignored); when none match (e.g.
    hand-made or imported runs), keep them all."""
    keep = [True] * len(metas)
    for prof in {m.get("profile") for m in metas}:
        idx = [i for i, m in enumerate(metas) if m.get("profile") == prof]
        match = [i for i in idx
                 if metas[i].get("config_sha256") == _current_hash(study, prof, metas[i].get("engine") or "torch")]
        if match and len(match) < len(idx):
            others = set(idx) - set(match)
            for i in others:
                keep[i] = False
            staged = _staged_hash(study, prof)
            n_staged = sum(1 for i in others if staged and metas[i].get("config_sha256") == staged)
            if len(others) - n_staged:
                warn(f"ignored {len(others) - n_staged} run(s) of {study}/{prof} measured under an older config")
            if n_staged:
                warn(f"set aside {n_staged} run(s) of {study}/{prof} measured under the staged torch_next "
                     f"(current once it is promoted into torch)")
    return keep


def current_runs(study: str, profile: str | None = None, warn=print, complete=None) -> list[tuple[Path, dict]]:
    """(folder, meta) of the complete runs of a study, older-config runs dropped as in _keep_current."""
    complete = scan(profile, study)[0] if complete is None else complete
    pairs = [(folder, read_meta(folder)) for folder in complete]
    keep = _keep_current([m for _, m in pairs], study, warn)
    return [pair for pair, k in zip(pairs, keep) if k]


def load(study: str, profile: str | None = None, table: str = "requests", warn=print) -> pd.DataFrame:
    """One table of every complete run of a study, with the run's cell and profile as columns.

    Partial runs are reported through `warn` and skipped, and so are runs measured under an older version
    of the study config when runs under the current one exist (see _keep_current); no complete run is a
    one-line error."""
    if table not in TABLES:
        raise SpecdecError(f"unknown raw table '{table}'; known: {', '.join(TABLES)}")
    complete, partial, bad = scan_all(profile, study)
    for folder in partial:
        warn(f"skipping partial run {folder} (no complete meta.json)")
    for folder, why in bad:
        warn(f"skipping CORRUPT run {folder}: {why}")
    frames = []
    for folder, meta in current_runs(study, profile, warn, complete):
        path = folder / f"{table}.parquet"
        if not path.exists():
            continue
        try:
            df = pd.read_parquet(path)
        except Exception as e:  # a corrupt parquet file: report, do not load
            warn(f"skipping corrupt run {folder}: {type(e).__name__}")
            continue
        if "pair" in df:  # a paired run's pair index (pairing.py), not the model pair added below
            df = df.rename(columns={"pair": "pair_idx"})
        for key, val in meta["cell"].items():
            df[key] = val
        df["profile"], df["run_id"], df["engine"] = meta["profile"], meta["run_id"], meta.get("engine", "torch")
        df["pair"] = meta["config"].get("pair")
        frames.append(df)
    if not frames:
        where = f"data/raw/{profile or '*'}/{study}"
        raise SpecdecError(f"no complete raw runs in {where} (run `make measure GPU=...` or use the fixture)")
    return pd.concat(frames, ignore_index=True)
