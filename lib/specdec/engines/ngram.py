"""Prompt-lookup (n-gram) proposals: copy what followed an earlier match of the context's suffix.

The longest suffix of length max_n..min_n that occurs earlier in the context wins. Among its earlier
occurrences, `match` picks one:
  * "earliest": the first occurrence, as vLLM's NgramProposer does (reverse KMP, `>=` keeps the last hit in
    reversed order, i.e. the earliest position); the default for new measurements;
  * "latest": the most recent occurrence, what this engine did before the rule was a setting (runs whose
    config has no `generation.ngram_match` were measured with it).
"""
from __future__ import annotations

import numpy as np

from ..data.spec import MATCH_RULES  # the rules are config values (spec.py)


def lookup(history: np.ndarray, k: int, max_n: int = 3, min_n: int = 1, match: str = "earliest") -> np.ndarray:
    """Up to k proposed tokens for one sequence (empty when no n-gram of length min_n..max_n recurs)."""
    if match not in MATCH_RULES:
        raise ValueError(f"unknown n-gram match rule '{match}' ({', '.join(MATCH_RULES)})")
    size = len(history)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = history[size - n:]
        windows = np.lib.stride_tricks.sliding_window_view(history[: size - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[0] if match == "earliest" else hits[-1]) + n
            return history[start:start + k]
    return history[:0]


def propose(histories: list[np.ndarray], k: int, max_n: int = 3, min_n: int = 1, pad: int = 0,
            match: str = "earliest"):
    """Proposals for a batch: tokens (batch, k) padded with `pad`, and counts (batch,) of real ones."""
    tokens = np.full((len(histories), k), pad, dtype=np.int64)
    counts = np.zeros(len(histories), dtype=np.int64)
    for i, hist in enumerate(histories):
        got = lookup(hist, k, max_n, min_n, match)
        tokens[i, : len(got)] = got
        counts[i] = len(got)
    return tokens, counts
