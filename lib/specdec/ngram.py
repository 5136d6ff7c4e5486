"""Prompt-lookup (n-gram) proposals: copy what followed the latest earlier match of the context's suffix."""
from __future__ import annotations

import numpy as np


def lookup(history: np.ndarray, k: int, max_n: int = 3, min_n: int = 1) -> np.ndarray:
    """Up to k proposed tokens for one sequence (empty when no n-gram of length min_n..max_n recurs)."""
    size = len(history)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = history[size - n:]
        windows = np.lib.stride_tricks.sliding_window_view(history[: size - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return history[start:start + k]
    return history[:0]


def propose(histories: list[np.ndarray], k: int, max_n: int = 3, min_n: int = 1, pad: int = 0):
    """Proposals for a batch: tokens (batch, k) padded with `pad`, and counts (batch,) of real ones."""
    tokens = np.full((len(histories), k), pad, dtype=np.int64)
    counts = np.zeros(len(histories), dtype=np.int64)
    for i, hist in enumerate(histories):
        got = lookup(hist, k, max_n, min_n)
        tokens[i, : len(got)] = got
        counts[i] = len(got)
    return tokens, counts
