"""The claims verdict table: every claim of the paper (DEVELOPERS.md), decided from our data."""
from ..report import claims as C
from ..report import figures as F

SOURCE = ("batch", "hardware", "acceptance")  # shown measured where any of these raw studies has runs
TABLES = ("claims",)  # build/<profile>/<name>.csv
FIGURES = ("claims-verdicts",)  # figures/<profile>/<name>.png|pdf
FILES = ("claims.md",)  # other build/<profile>/ files, besides <stem>-notes.json
# raw studies its notebook reads ("all": every profile's runs)
READS = ("batch", "acceptance", "hardware", "alternatives", "serving", "all")


def tables(profile: str):
    return {"claims": C.verdicts(profile)}, {}


def figures(out):
    return {"claims-verdicts": F.claims_verdicts(out["claims"], out.profile)}


def files(out):
    return {"claims.md": C.to_markdown(out["claims"])}
