"""Study "acceptance": per-position and per-request acceptance, real traces vs i.i.d., break-even acceptance."""
from ..report import figures as F
from ..report import views

SOURCE = "acceptance"
TABLES = ("acceptance-positions", "acceptance-requests", "acceptance-summary", "acceptance-iid",
          "acceptance-synthetic", "acceptance-breakeven", "acceptance-engines")  # build/<profile>/<name>.csv
# figures/<profile>/<name>.png|pdf
FIGURES = ("acceptance-positions", "acceptance-requests", "acceptance-iid", "acceptance-breakeven")
FILES = ()  # other build/<profile>/ files, besides <stem>-notes.json
READS = ("acceptance",)  # raw studies its notebook reads ("all": every profile's runs)


def tables(profile: str):
    pos, pos_note = views.position_acceptance(profile)
    req, summ, req_note = views.request_acceptance(profile)
    iid, iid_note = views.iid_prediction(profile)
    syn, be, syn_note = views.break_even(profile)
    eng, eng_note = views.acceptance_engines(profile)
    return ({"acceptance-positions": pos, "acceptance-requests": req, "acceptance-summary": summ,
             "acceptance-iid": iid, "acceptance-synthetic": syn, "acceptance-breakeven": be,
             "acceptance-engines": eng},
            {"acceptance-positions": pos_note, "acceptance-requests": req_note, "acceptance-iid": iid_note,
             "acceptance-breakeven": syn_note, "acceptance-engines": eng_note})


def figures(out):
    profile = out.profile
    return {"acceptance-positions": F.acceptance_positions(out["acceptance-positions"], profile,
                                                           out.note("acceptance-positions")),
            "acceptance-requests": F.acceptance_requests(out["acceptance-requests"], profile,
                                                         out.note("acceptance-requests")),
            "acceptance-iid": F.acceptance_iid(out["acceptance-iid"], profile, out.note("acceptance-iid")),
            "acceptance-breakeven": F.acceptance_breakeven(out["acceptance-synthetic"], out["acceptance-breakeven"],
                                                           profile, out.note("acceptance-breakeven"))}
