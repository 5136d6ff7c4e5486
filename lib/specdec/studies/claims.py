"""The claims verdict table: every claim of the paper (DEVELOPERS.md), decided from our data."""
from .. import claims as C
from .. import figures as F

SOURCE = "claims"


def tables(gpu: str):
    return {"claims": C.verdicts(gpu)}, {}


def figures(out):
    return {"claims-verdicts": F.claims_verdicts(out["claims"], out.gpu)}


def files(out):
    return {"claims.md": C.to_markdown(out["claims"])}
