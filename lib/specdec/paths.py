"""Where things live: the repository root (configs/, data/, figures/), overridable with $SPECDEC_ROOT."""
from __future__ import annotations

import os
from pathlib import Path


def root() -> Path:
    env = os.environ.get("SPECDEC_ROOT")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "configs").is_dir() and (parent / "lib").is_dir():
            return parent
    return Path.cwd()


def configs() -> Path:
    return root() / "configs"


def raw_root() -> Path:
    return Path(os.environ.get("SPECDEC_RAW", root() / "data" / "raw"))


def build_root() -> Path:
    """Generated tables and notebooks (build/), overridable with $SPECDEC_BUILD."""
    return Path(os.environ.get("SPECDEC_BUILD") or root() / "build")
