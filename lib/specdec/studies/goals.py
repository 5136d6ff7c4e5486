"""The goals benchmark: every stated target, its value, met or not (goals.py)."""
from ..report import goals as G

SOURCE = None
TABLES = ("goals",)  # build/<profile>/<name>.csv
FIGURES = ()  # figures/<profile>/<name>.png|pdf
FILES = ("goals.md",)  # other build/<profile>/ files, besides <stem>-notes.json
READS = ("all",)  # raw studies its notebook reads ("all": every profile's runs)


def tables(profile: str):
    from . import check
    return {"goals": G.table(check)}, {}


def figures(out):
    return {}


def files(out):
    return {"goals.md": G.to_markdown(out["goals"])}
