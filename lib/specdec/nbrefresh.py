"""Refresh the committed notebooks' checked outputs: execute each against the CI fixture and keep only the
outputs of cells starting with `# NBVAL_CHECK_OUTPUT` (everything else stripped), so nbval compares them."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from . import paths

CHECK = "# NBVAL_CHECK_OUTPUT"


def keep_checked(src, run) -> int:
    """Copy checked outputs from the executed notebook `run` into `src`; strip the rest. Returns the count."""
    by_source = {c.source: c for c in run.cells if c.cell_type == "code"}
    kept = 0
    for cell in src.cells:
        if cell.cell_type != "code":
            continue
        cell.execution_count, cell.outputs = None, []
        for key in ("execution", "papermill"):
            cell.metadata.pop(key, None)
        if cell.source.startswith(CHECK):
            done = by_source[cell.source]
            if any(o.get("output_type") == "error" for o in done.outputs):
                raise RuntimeError(f"a checked cell failed:\n{cell.source}")
            cell.execution_count = done.execution_count  # nbval wants a count on cells with outputs
            cell.outputs = done.outputs
            for out in cell.outputs:
                if "execution_count" in out:
                    out["execution_count"] = None
            kept += 1
    src.metadata.pop("papermill", None)
    return kept


def refresh(stems: list[str], profile: str = "fixture", echo=print) -> None:
    import nbformat
    import papermill

    nb_dir = paths.root() / "notebooks"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(SPECDEC_GPU=profile, SPECDEC_FIGURES=f"{tmp}/figures", SPECDEC_BUILD=f"{tmp}/build")
        for stem in stems:
            path = nb_dir / f"{stem}.ipynb"
            out = Path(tmp) / path.name
            papermill.execute_notebook(str(path), str(out), parameters={"profile": profile}, cwd=str(nb_dir),
                                       progress_bar=False, log_output=False)
            src = nbformat.read(path, as_version=4)
            kept = keep_checked(src, nbformat.read(out, as_version=4))
            nbformat.validate(src)
            nbformat.write(src, path)
            echo(f"{stem}: {kept} checked cell(s) refreshed against '{profile}'")
