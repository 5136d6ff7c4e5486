"""Measured or predicted, decided once per view: a predicted table (report/predicted.py) stands in for the
analysis table of the same name, so it carries the measured table's columns, except the ones predicted.py
declares measured-only (MEASURED_ONLY); a new measured column must be predicted or declared."""
import pytest

from specdec.errors import SpecdecError
from specdec.report import analysis, predicted, views

# analysis function (and the study whose fixture runs it reads) for each predicted table
MEASURED = {
    "speedup": lambda: analysis.speedup("fixture", "batch"),
    "draft_overhead": lambda: analysis.draft_overhead("fixture", "batch"),
    "position_acceptance": lambda: analysis.position_acceptance("fixture", "acceptance"),
    "request_acceptance": lambda: analysis.request_acceptance("fixture", "acceptance"),
    "acceptance_summary": lambda: analysis.acceptance_summary("fixture", "acceptance"),
    "iid_prediction": lambda: analysis.iid_prediction("fixture", "acceptance"),
    "synthetic_speedup": lambda: analysis.synthetic_speedup("fixture", "acceptance"),
    "break_even": lambda: analysis.break_even("fixture", "acceptance"),
    "forward_times": lambda: analysis.forward_times("fixture", "hardware"),
    "forward_ratio": lambda: analysis.forward_ratio("fixture", "hardware"),
}


def test_every_predicted_table_mirrors_an_analysis_table():
    public = {n for n in dir(predicted) if not n.startswith("_") and callable(getattr(predicted, n))
              and getattr(getattr(predicted, n), "__module__", "") == predicted.__name__}
    assert public - {"inputs"} == set(MEASURED) == set(predicted.MEASURED_ONLY)
    assert all(hasattr(analysis, n) for n in MEASURED)


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_predicted_columns_cover_the_measured_ones(name):
    got = MEASURED[name]()
    meas = got[0] if isinstance(got, tuple) else got
    pred = getattr(predicted, name)("h100")
    assert len(meas) and len(pred)
    missing = [c for c in meas.columns if c not in pred.columns]
    declared = set(predicted.MEASURED_ONLY[name])
    assert [c for c in missing if c not in declared] == [], f"{name}: predict these, or declare them measured-only"
    assert declared <= set(meas.columns), f"{name}: declared columns the measured table no longer has"


def test_a_view_picks_measured_where_runs_exist_else_predicted_else_says_why():
    assert (views.speedup("fixture")["basis"] == "measured").all()
    assert (views.speedup("h100")["basis"] == "predicted").all()
    assert views.forward_times("h100").equals(predicted.forward_times("h100"))
    table, note = views.draft_overhead("h100")
    assert table.equals(predicted.draft_overhead("h100")) and note == ""
    with pytest.raises(SpecdecError, match="unknown hardware profile"):
        views.speedup("no-such-gpu")
