"""Study "validation": predicted vs measured (or the paper's simulator) speedup; SD policies."""
from .. import figures as F
from .. import views

SOURCE = "validation"


def tables(gpu: str):
    val, val_note, reference = views.validation(gpu)
    pol, pol_note = views.policy(gpu)
    notes = {"validation-predicted-vs-measured": val_note, "validation-policy": pol_note, "reference": reference,
             "cost_source": val.attrs.get("cost_source", "")}
    return {"validation-predicted-vs-measured": val, "validation-policy": pol}, notes


def figures(out):
    return {"validation-predicted-vs-measured": F.validation_scatter(
                out["validation-predicted-vs-measured"], out.gpu, out.note("validation-predicted-vs-measured"),
                out.note("reference") or "measured"),
            "validation-policy": F.validation_policy(out["validation-policy"], out.gpu,
                                                     out.note("validation-policy"))}
