"""Study modules: tables computed once, figures drawn from the tables alone (and re-drawn from saved CSVs)."""
import pytest

from specdec import figures, studies
from specdec.errors import SpecdecError


@pytest.fixture
def roots(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("SPECDEC_BUILD", str(tmp_path / "build"))
    return tmp_path


@pytest.mark.parametrize("stem", ["batch", "bench"])
def test_saved_tables_redraw_the_same_figures(roots, stem):
    out = studies.compute(stem, "fixture")
    assert list(out.tables) == figures.OUTPUTS[stem]["tables"]
    out.save()
    again = studies.Outputs.load(stem, "fixture")
    assert list(again.tables) == list(out.tables) and again.notes == out.notes
    first = studies.draw(out)
    drawn = studies.redraw("fixture", [stem], echo=lambda _m: None)
    assert drawn == list(first) == figures.OUTPUTS[stem]["figures"]
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
