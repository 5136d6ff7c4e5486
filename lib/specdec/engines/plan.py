"""What every engine's `measure` does before its first cell, once: the profile and the machine check, the
study config, the cells still missing (the resume rule: rawdata.pending_cells), the limit and the dry run.

  plan(study, profile, engine, ...) -> Plan   engine: "torch" | "vllm" | "vllm server"

Folders are <cell-id>-<config hash> (torch) or <cell-id>-vllm-<config hash> (vLLM, static or served: the
hash leaves out the torch-only sections), so the engines' runs never collide.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..data import config as cfgmod
from ..data import hardware, rawdata
from ..data.spec import Study
from ..errors import SpecdecError


@dataclass
class Plan:
    """The cells a measure call will run: pending [(cell, folder, prepared)] (cut to the limit), with the counts
    it returns (cells, ran, pending: still missing before the limit, unsupported where the engine reports it)."""

    study: str
    profile: str
    hw: dict  # the profile's configs/hardware yaml, loaded
    machine: dict
    cfg: dict
    st: Study
    todo: list
    pending: list
    unsupported: list
    counts: dict

    @property
    def done(self) -> bool:
        """True when nothing is to run now (a dry run, or no missing cell)."""
        return not self.pending


def plan(study: str, profile: str, engine: str, limit: int | None = None, dry_run: bool = False, echo=print,
         only: str | None = None, prepare=None, check=None, staged: bool = False) -> Plan:
    """Load and check everything a measure call needs; echo one line of counts. The config is the engine's view
    of it (config.engine_view), parsed once (Plan.st). `prepare(st, cell)` returns what running a cell needs or
    raises SpecdecError (the cell is then unsupported); `check()` runs after the profile is known and before the
    machine check (e.g. that vLLM is installed; skipped for a dry run). staged: the torch engine measures the
    config's staged torch settings (config.next_view: `measure --next`), in folders of that config's hash."""
    hw = hardware.load_profile(profile)
    if check is not None and not dry_run:
        check()
    machine = hardware.describe_machine()
    hardware.check_machine(hw, machine)
    kind = "vllm" if engine.startswith("vllm") else "torch"
    cfg = cfgmod.engine_view(cfgmod.load_study(study, profile), kind)
    if staged:
        if kind != "torch":
            raise SpecdecError("--next measures the torch engine's staged settings (torch_next); vLLM has none")
        cfg = cfgmod.next_view(cfg)
    st = Study.from_dict(cfg)  # parsed once; every engine helper takes this
    todo = cfgmod.select(cfgmod.cells(cfg), only, study)
    chash = cfgmod.config_hash(cfg, kind)
    pending, unsupported = rawdata.pending_cells(
        profile, study, todo, lambda c: cfgmod.run_name(c, chash, kind), echo,
        prepare=(lambda c: prepare(st, c)) if prepare else None, dry_run=dry_run)
    for cid, reason in unsupported:
        echo(f"skipping {cid}: {reason}")
    done = len(todo) - len(pending) - len(unsupported)
    label = (" (staged torch_next)" if staged else "") if engine == "torch" else f" ({engine})"
    echo(f"{study} on {profile}{label}: {len(todo)} cells, {done} done, {len(pending)} to run"
         + (f", {len(unsupported)} unsupported" if engine == "vllm" else ""))
    counts = {"cells": len(todo), "ran": 0, "pending": len(pending)}
    if engine != "torch":
        counts["unsupported"] = len(unsupported)
    pending = pending[:limit] if limit is not None else pending
    if dry_run:
        pending = []
    else:
        rawdata.git_state()  # read now, before the first cell: the code this process imported
    return Plan(study, profile, hw, machine, cfg, st, todo, pending, unsupported,
                counts)
