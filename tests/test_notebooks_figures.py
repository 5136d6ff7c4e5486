"""The study notebooks: conventions (thin views), and executing each one against the CI fixture writes every
expected figure (png + pdf) and table. Outputs go to temporary roots via $SPECDEC_FIGURES / $SPECDEC_BUILD."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import nbformat
import pytest

from specdec import paths, studies

NOTEBOOKS = Path(paths.root()) / "notebooks"
STUDIES = list(studies.OUTPUTS)
CHECK = "# NBVAL_CHECK_OUTPUT"


def _read(stem):
    return nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)


@pytest.mark.parametrize("stem", STUDIES)
def test_notebook_conventions(stem):
    nb = _read(stem)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    first = code[0]
    assert "parameters" in first.metadata.get("tags", [])
    assert first.source.strip() == 'import os\nprofile = os.environ.get("SPECDEC_GPU", "cpu")'
    assert any(c.cell_type == "markdown" for c in nb.cells), "a markdown cell explains the study"
    assert any(c.source.startswith(CHECK) for c in code), "at least one checked headline cell"
    for c in code:
        tree = ast.parse(c.source)
        defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
        assert not defs, f"{stem}: helpers belong in lib/specdec, not in the notebook"
        if c.source.startswith(CHECK):
            assert c.outputs, f"{stem}: checked cells keep their fixture outputs"
        else:
            assert not c.outputs and c.execution_count is None, f"{stem}: outputs of unchecked cells are stripped"


@pytest.mark.parametrize("stem", STUDIES)
def test_notebook_writes_its_figures_and_tables(stem, tmp_path, monkeypatch):
    """Checks the files a fixture run of the notebook wrote. Under `make test` nbval has just executed every
    notebook into $SPECDEC_NOTEBOOK_OUTPUTS (figures/, build/), so they are not executed twice; without
    it, the notebook is executed here with papermill."""
    done = os.environ.get("SPECDEC_NOTEBOOK_OUTPUTS")
    if done:
        figs, build = Path(done) / "figures", Path(done) / "build"
        assert (figs / "fixture").is_dir() or not studies.OUTPUTS[stem]["figures"], f"nbval wrote nothing to {figs}"
    else:
        papermill = pytest.importorskip("papermill")
        figs, build = tmp_path / "figures", tmp_path / "build"
        monkeypatch.setenv("SPECDEC_FIGURES", str(figs))
        monkeypatch.setenv("SPECDEC_BUILD", str(build))
        monkeypatch.setenv("SPECDEC_GPU", "fixture")
        papermill.execute_notebook(str(NOTEBOOKS / f"{stem}.ipynb"), str(tmp_path / f"{stem}.out.ipynb"),
                                   parameters={"profile": "fixture"}, kernel_name="python3", cwd=str(NOTEBOOKS),
                                   progress_bar=False)
    want = studies.OUTPUTS[stem]
    for name in want["figures"]:
        for ext in ("png", "pdf"):
            f = figs / "fixture" / f"{name}.{ext}"
            assert f.is_file() and f.stat().st_size > 1000, f"missing figure {f}"
    for name in want["tables"]:
        assert (build / "fixture" / f"{name}.csv").is_file(), f"missing table {name}.csv"
    for name in want["files"]:
        assert (build / "fixture" / name).is_file(), f"missing {name}"
    if done:  # one folder for all notebooks: what carries this stem's prefix must be exactly its list
        made = {p.stem for p in (figs / "fixture").glob("*.png") if p.stem == stem or p.stem.startswith(stem + "-")}
        assert made == set(want["figures"]), "studies.OUTPUTS lists exactly what the notebook writes"
    else:
        made = {p.stem for p in (figs / "fixture").glob("*.png")}
        assert made == set(want["figures"]), "studies.OUTPUTS lists exactly what the notebook writes"
        assert all(n.startswith(stem) for n in made), "figure names start with the study stem"


def test_no_notebook_writes_an_unlisted_figure():
    done = os.environ.get("SPECDEC_NOTEBOOK_OUTPUTS")
    if not done:
        pytest.skip("checked per notebook when the notebooks are executed here")
    made = {p.stem for p in (Path(done) / "figures" / "fixture").glob("*.png")}
    listed = {n for o in studies.OUTPUTS.values() for n in o["figures"]}
    assert made == listed
