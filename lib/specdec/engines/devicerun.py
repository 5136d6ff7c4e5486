"""One prepared call on a lent machine: measure the hardware study, then the batch study, within a time budget,
and pack every complete run of the profile into one archive that the call brings back; unpack it here.

  run(profile, out, budget_s)   hardware first (forward costs, then offloaded forwards), then batch, each cell
                            written as it finishes; no cell starts after the budget; then
                            OUT/<profile>-runs.tar.gz (complete runs only) and OUT/<profile>-device-run.json (what ran)
  unpack(archive)           adds the archive's runs to data/raw; an existing run is never overwritten (one
                            with the same name and a different meta.json is a one-line error, nothing written)

The device copies the working tree without .git: the command passes the commit as $SPECDEC_COMMIT (rawdata).
Units: seconds.
"""
from __future__ import annotations

import json
import tarfile
import time
from pathlib import Path

from .. import paths
from ..data import rawdata
from ..errors import SpecdecError

STUDIES = ("hardware", "batch")
SHARE = {"hardware": 0.35}  # of the budget; the batch study gets the rest (and whatever hardware left)
PACK_S = 20.0  # kept back from the budget for packing


def run(profile: str, out: str | Path, budget_s: float, echo=print) -> dict:
    from . import harness

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    report = {"gpu": profile, "budget_s": budget_s, "studies": {}}
    for study in STUDIES:
        left = budget_s - PACK_S - (time.monotonic() - t0)
        share = left * SHARE[study] if study in SHARE else left
        t = time.monotonic()
        try:
            res = harness.measure(study, profile, budget_s=max(share, 0.0), echo=echo)
        except Exception as e:  # noqa: BLE001 - a lent machine's minutes are scarce: report, pack what finished
            import traceback
            res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
            echo(f"error: {study}: {res['traceback'] if not isinstance(e, SpecdecError) else e}")
        report["studies"][study] = {**res, "seconds": time.monotonic() - t}
        echo(f"{study}: ran {res.get('ran')}, pending {res.get('pending')} in {time.monotonic() - t:.0f} s")
    report["archive"], report["runs"] = pack(profile, out / f"{profile}-runs.tar.gz")
    report["seconds"] = time.monotonic() - t0
    (out / f"{profile}-device-run.json").write_text(json.dumps(report, indent=1))
    return report


def pack(profile: str, archive: Path) -> tuple[str, int]:
    """Every complete run under data/raw/<profile>/ into a gzip tar (paths <profile>/<study>/<run>/...)."""
    root = paths.raw_root()
    complete, _, _ = rawdata.scan_all(profile)
    with tarfile.open(archive, "w:gz") as tar:
        for folder in complete:
            tar.add(folder, arcname=str(Path(folder).relative_to(root)))
    return str(archive), len(complete)


def unpack(archive: str | Path, echo=print) -> int:
    """Add the archive's runs to data/raw; returns how many were new. Refuses unsafe paths and conflicts."""
    archive = Path(archive)
    if not archive.is_file():
        raise SpecdecError(f"no archive {archive}")
    root = paths.raw_root()
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as e:
        raise SpecdecError(f"{archive}: not a gzip tar of runs ({e})") from None
    with tar:
        members = tar.getmembers()
        runs = {}
        for m in members:
            parts = Path(m.name).parts
            if m.name.startswith("/") or ".." in parts or len(parts) < 3 or not (m.isfile() or m.isdir()):
                raise SpecdecError(f"{archive}: unexpected member {m.name!r} (want <profile>/<study>/<run>/<file>)")
            runs.setdefault(Path(*parts[:3]), []).append(m)
        new = 0
        for run, items in sorted(runs.items()):
            meta = next((m for m in items if Path(m.name).name == "meta.json" and len(Path(m.name).parts) == 4),
                        None)
            if meta is None:
                raise SpecdecError(f"{archive}: run {run} has no meta.json (an incomplete run)")
            dest = root / run
            if dest.exists():
                if (dest / "meta.json").exists() and (dest / "meta.json").read_bytes() == tar.extractfile(meta).read():
                    continue  # the same run, unpacked before
                raise SpecdecError(f"{dest} exists and differs from the archive's run: nothing unpacked over it")
        for run, items in sorted(runs.items()):
            dest = root / run
            if dest.exists():
                continue
            tmp = dest.with_name(dest.name + ".unpacking")
            for m in items:
                if m.isfile():
                    target = tmp / Path(*Path(m.name).parts[3:])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(m).read())
            tmp.rename(dest)
            new += 1
            echo(f"added {dest}")
    return new

