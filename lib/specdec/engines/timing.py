"""The one clock of the project: wall seconds around synchronized device work.

`clock(device)` waits for queued device work (torch.cuda.synchronize on a CUDA device; nothing on the CPU,
whose kernels run synchronously) and returns time.perf_counter() in seconds. Every timed region is
`t = clock(dev); ...; dt = clock(dev) - t`.
"""
from __future__ import annotations

import time

import torch


def sync(device) -> None:
    """Block until all work queued on `device` has finished (no-op for the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def clock(device) -> float:
    """sync(device), then time.perf_counter() (seconds)."""
    sync(device)
    return time.perf_counter()
