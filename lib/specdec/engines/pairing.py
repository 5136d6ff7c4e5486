"""Paired, interleaved measurement (study config `timing.paired: true`), shared by both engines.

The machine drifts by up to 2x within an hour, so a speedup taken from an SD cell and a no-SD cell measured
at different times can be off by that much. In a paired cell every timed batch runs twice on the same
prompts: once as the cell ("cell" arm: its k and proposer) and once without speculation ("base" arm: k = 0),
back to back, the order alternating from pair to pair (A B, B A, A B, ...) so neither arm always runs first.
The speedup is taken per pair and bootstrapped over pairs (analysis.speedup). A k = 0 cell is its own base.
"""
from __future__ import annotations

ARMS = ("cell", "base")


def is_paired(study, cell) -> bool:
    """True when this cell of this study (spec.Study, spec.Cell) runs a base arm beside it."""
    return bool(study.timing.paired) and cell.k > 0 and cell.mode == "static"


def order(pair_idx: int, arms: tuple[str, ...] = ARMS) -> tuple[str, ...]:
    """The arms of pair `pair_idx` (0, 1, ...) in the order they run: the first arm (the cell) first on even
    pairs."""
    return arms if pair_idx % 2 == 0 else arms[::-1]
