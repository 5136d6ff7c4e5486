"""Study modules: tables computed once, figures drawn from the tables alone (and re-drawn from saved CSVs);
each study declared once (its module), everything else derived or checked against it."""
import re
from pathlib import Path

import pytest

from specdec import studies
from specdec.errors import SpecdecError


@pytest.fixture
def roots(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("SPECDEC_BUILD", str(tmp_path / "build"))
    return tmp_path


@pytest.mark.parametrize("stem", ["batch", "bench"])
def test_saved_tables_redraw_the_same_figures(roots, stem):
    out = studies.compute(stem, "fixture")
    assert list(out.tables) == studies.OUTPUTS[stem]["tables"]
    out.save()
    again = studies.Outputs.load(stem, "fixture")
    assert list(again.tables) == list(out.tables) and again.notes == out.notes
    first = studies.draw(out)
    drawn = studies.redraw("fixture", [stem], echo=lambda _m: None)
    assert drawn == list(first) == studies.OUTPUTS[stem]["figures"]
    for name in drawn:
        assert (roots / "figures" / "fixture" / f"{name}.png").stat().st_size > 1000
    # the reloaded tables draw the same axes (same lines and labels) as the computed ones
    for name, fig in studies.draw(again).items():
        a, b = first[name].axes[0], fig.axes[0]
        assert len(a.lines) == len(b.lines) and a.get_title() == b.get_title()


def test_redraw_without_saved_tables_says_what_to_run(roots):
    with pytest.raises(SpecdecError, match="make nb-batch GPU=fixture"):
        studies.redraw("fixture", ["batch"])


def test_unknown_study(roots):
    with pytest.raises(SpecdecError, match="unknown study"):
        studies.compute("nope", "fixture")


ROOT = Path(__file__).resolve().parents[1]


def _makefile_reads() -> dict:
    """{stem: set of raw studies} from the Makefile's notebook rules ($(call raw,X); $(STATE)/all.runs -> all)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    reads = {}
    for stem, deps in re.findall(r"^\$\(BUILD\)/notebooks/([a-z]+)\.ipynb:(.*)$", text, re.M):
        found = set(re.findall(r"\$\(call raw,([a-z]+)\)", deps)) | ({"all"} if "$(STATE)/all.runs" in deps else set())
        reads[stem] = reads.get(stem, set()) | found
    return reads


def test_each_study_is_declared_once_and_the_rest_follows():
    stems = set(studies.STEMS)
    assert stems == {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}, "one notebook per study module"
    assert {p.stem for p in (ROOT / "configs").glob("*.yaml")} <= stems, "every measured study has a module"
    assert _makefile_reads() == {s: set(studies.module(s).READS) for s in stems}, "Makefile prerequisites = READS"
    for stem in stems:
        mod = studies.module(stem)
        names = [*mod.TABLES, *mod.FIGURES, *mod.FILES]
        assert names and all(n.startswith(stem) for n in names), stem
        assert set(mod.READS) <= stems | {"all"}


def test_the_makefile_check_sees_a_missing_prerequisite(monkeypatch):
    real = _makefile_reads()
    assert real["serving"] == {"serving", "batch"} and real["goals"] == {"all"}
    text = (ROOT / "Makefile").read_text().replace("$(BUILD)/notebooks/serving.ipynb: $(call raw,serving) ",
                                                     "$(BUILD)/notebooks/serving.ipynb: ")
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text)
    assert _makefile_reads()["serving"] == {"batch"}


def test_a_study_is_measured_or_predicted_by_its_declared_sources():
    """studies.mode reads each study's SOURCE: derived studies (validation, claims) follow their raw studies, a
    study whose raw study cannot be predicted (alternatives) is NO DATA where unmeasured; SOURCEs name raw studies."""
    from specdec import paths
    from specdec.report import predicted
    raw = {p.stem for p in paths.configs().glob("*.yaml")}
    for stem in studies.STEMS:
        assert set(studies.sources(stem)) <= raw, stem
    assert set(predicted.STUDIES) <= raw
    assert studies.sources("validation") == ("batch", "hardware", "acceptance") and studies.sources("goals") == ()
    assert studies.mode("validation", "h100").kind == "predicted"
    assert studies.mode("claims", "cpu").kind == "measured" and studies.mode("claims", "cpu").text == "data/raw/cpu/*"
    assert studies.mode("alternatives", "h100").kind == "none"
    assert studies.mode("serving", "h100").kind == "none"
    lines = studies.check("h100")
    assert [line.split(":")[0] for line in lines] == [s for s in studies.STEMS if studies.sources(s)]
    assert "validation: PREDICTED" in "\n".join(lines) and "bench: NO DATA" in "\n".join(lines)
    with pytest.raises(SpecdecError, match="nosuchgpu"):
        studies.check("nosuchgpu")
