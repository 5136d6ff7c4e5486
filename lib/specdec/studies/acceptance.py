"""Study "acceptance": per-position and per-request acceptance, real traces vs i.i.d., break-even acceptance."""
from ..report import figures as F
from ..report import views

SOURCE = "acceptance"
TABLES = ("acceptance-positions", "acceptance-requests", "acceptance-summary", "acceptance-iid",
          "acceptance-synthetic", "acceptance-breakeven")  # build/<gpu>/<name>.csv
# figures/<gpu>/<name>.png|pdf
FIGURES = ("acceptance-positions", "acceptance-requests", "acceptance-iid", "acceptance-breakeven")
FILES = ()  # other build/<gpu>/ files, besides <stem>-notes.json
READS = ("acceptance",)  # raw studies its notebook reads ("all": every profile's runs)


def tables(gpu: str):
    pos, pos_note = views.position_acceptance(gpu)
    req, summ, req_note = views.request_acceptance(gpu)
    iid, iid_note = views.iid_prediction(gpu)
    syn, be, syn_note = views.break_even(gpu)
    return ({"acceptance-positions": pos, "acceptance-requests": req, "acceptance-summary": summ,
             "acceptance-iid": iid, "acceptance-synthetic": syn, "acceptance-breakeven": be},
            {"acceptance-positions": pos_note, "acceptance-requests": req_note, "acceptance-iid": iid_note,
             "acceptance-breakeven": syn_note})


def figures(out):
    gpu = out.gpu
    return {"acceptance-positions": F.acceptance_positions(out["acceptance-positions"], gpu,
                                                           out.note("acceptance-positions")),
            "acceptance-requests": F.acceptance_requests(out["acceptance-requests"], gpu,
                                                         out.note("acceptance-requests")),
            "acceptance-iid": F.acceptance_iid(out["acceptance-iid"], gpu, out.note("acceptance-iid")),
            "acceptance-breakeven": F.acceptance_breakeven(out["acceptance-synthetic"], out["acceptance-breakeven"],
                                                           gpu, out.note("acceptance-breakeven"))}
