"""A fixed reference probe of the machine, taken before and after every measured cell (meta.json `probe`).

The machine drifts (other tenants share the memory bus): the same no-SD run measured 2.40 and 1.06 tok/s an
hour apart. The probe makes that visible: `read_gbs` times a sum over a 256 MiB fp32 tensor (one streaming
read, the operation that bounds a decode step at batch 1) and reports GB/s (1e9 bytes per second). A run
whose probe fell by more than DRIFT between before and after, or lies below LOW of its profile's median, is
flagged by analysis.drift(). Cross-engine throughput ratios that cannot be interleaved (the two engines never
share the memory) are also reported divided by their runs' probes (fraction of the read-bandwidth bound).
"""
from __future__ import annotations

import statistics
import time

SIZE_MB = 256
REPEATS = 7
DRIFT = 0.25  # |after / before - 1| above this flags a run
LOW = 0.7     # probe below this fraction of the profile's median flags a run


def read_gbs(size_mb: int = SIZE_MB, repeats: int = REPEATS) -> dict:
    """Read bandwidth in GB/s: median (and min, max) of `repeats` timed sums over `size_mb` MiB of fp32,
    after one untimed warm-up sum; also the wall time the probe took (s) and when (local time)."""
    import torch

    x = torch.ones(size_mb * (1 << 20) // 4, dtype=torch.float32)
    x.sum()
    rates = []
    t0 = time.perf_counter()
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        rates.append(x.numel() * 4 / (time.perf_counter() - t) / 1e9)
    del x
    return {"read_gbs": statistics.median(rates), "read_gbs_min": min(rates), "read_gbs_max": max(rates),
            "probe_s": time.perf_counter() - t0, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def drifted(probe: dict | None) -> bool:
    """True when a run's before/after probes differ by more than DRIFT (False when either is missing)."""
    try:
        before, after = probe["before"]["read_gbs"], probe["after"]["read_gbs"]
    except (KeyError, TypeError):
        return False
    return abs(after / before - 1) > DRIFT
