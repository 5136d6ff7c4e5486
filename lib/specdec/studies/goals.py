"""The goals benchmark: every stated target, its value, met or not (goals.py)."""
from .. import goals as G

SOURCE = None


def tables(gpu: str):
    return {"goals": G.table()}, {}


def figures(out):
    return {}


def files(out):
    return {"goals.md": G.to_markdown(out["goals"])}
