"""Where things live: the repository root (configs/, data/, figures/), overridable with $SPECDEC_ROOT."""
from __future__ import annotations

import functools
import os
from pathlib import Path


@functools.lru_cache(maxsize=16)
def _checkout(start: Path) -> Path | None:
    """The nearest folder at or above `start` that is a specdec checkout (configs/ and lib/specdec/); cached,
    since root() is asked for on every path lookup."""
    for folder in (start, *start.parents):
        if (folder / "configs").is_dir() and (folder / "lib" / "specdec").is_dir():
            return folder
    return None


def root() -> Path:
    """The checkout this package was imported from. Run from inside another checkout (a copy made with its
    .venv, whose editable install still points at the original), it is a one-line error instead of reading
    and writing the original's data."""
    env = os.environ.get("SPECDEC_ROOT")
    if env:
        return Path(env)
    mine = _checkout(Path(__file__).resolve().parent)
    here = _checkout(Path.cwd().resolve())
    if mine and here and here != mine:
        from .errors import SpecdecError
        raise SpecdecError(f"this is the checkout {here}, but specdec is imported from {mine}: recreate the "
                           f"environment here (rm -rf .venv && make venv) or set SPECDEC_ROOT")
    return mine or Path.cwd()


def configs() -> Path:
    return root() / "configs"


def raw_root() -> Path:
    return Path(os.environ.get("SPECDEC_RAW", root() / "data" / "raw"))


def build_root() -> Path:
    """Generated tables and notebooks (build/), overridable with $SPECDEC_BUILD."""
    return Path(os.environ.get("SPECDEC_BUILD") or root() / "build")
