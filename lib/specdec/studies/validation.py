"""Study "validation": predicted vs measured (or the paper's simulator) speedup; SD policies."""
from ..report import analysis, views
from ..report import figures as F

SOURCE = ("batch", "hardware", "acceptance")  # shown measured where any of these raw studies has runs
TABLES = ("validation-predicted-vs-measured", "validation-policy", "validation-paper-measured",
          "validation-calibration", "validation-decision-map", "validation-decision-points")  # build/<profile>/<name>.csv
FIGURES = ("validation-predicted-vs-measured", "validation-policy", "validation-paper-measured",
           "validation-decision-map")  # figures/<profile>/<name>.png|pdf
FILES = ()  # other build/<profile>/ files, besides <stem>-notes.json
READS = ("batch", "hardware", "acceptance")  # raw studies its notebook reads ("all": every profile's runs)


def tables(profile: str):
    val, val_note, reference = views.validation(profile)
    pol, pol_note = views.policy(profile)
    paper, paper_note = analysis.safe(views.paper_measured)
    cal, cal_note = analysis.safe(views.calibration_candidates)
    dmap, dpts, dnote = views.decision_map(profile)
    notes = {"validation-predicted-vs-measured": val_note, "validation-policy": pol_note, "reference": reference,
             "cost_source": val.attrs.get("cost_source", ""), "validation-paper-measured": paper_note or (
                 f"the paper's measured speedups (H100, vLLM 0.10.1): ours MAPE {paper.attrs['mape_predicted']:.1f}%, "
                 f"its simulator {paper.attrs['mape_simulator']:.1f}%, calibrated end to end "
                 f"({paper.attrs['calibration']}) {paper.attrs['mape_calibrated_cv']:.1f}% leaving each series out "
                 f"({paper.attrs['cost_source']})"), "validation-calibration": cal_note,
             "validation-decision-map": dnote}
    return {"validation-predicted-vs-measured": val, "validation-policy": pol,
            "validation-paper-measured": paper, "validation-calibration": cal,
            "validation-decision-map": dmap, "validation-decision-points": dpts}, notes


def figures(out):
    return {"validation-predicted-vs-measured": F.validation_scatter(
                out["validation-predicted-vs-measured"], out.profile, out.note("validation-predicted-vs-measured"),
                out.note("reference") or "measured"),
            "validation-policy": F.validation_policy(out["validation-policy"], out.profile,
                                                     out.note("validation-policy")),
            "validation-paper-measured": F.paper_measured(out["validation-paper-measured"], out.profile,
                                                          out.note("validation-paper-measured")),
            "validation-decision-map": F.decision_map(out["validation-decision-map"],
                                                      out["validation-decision-points"], out.profile,
                                                      out.note("validation-decision-map"))}
