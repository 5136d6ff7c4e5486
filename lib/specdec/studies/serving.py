"""Study "serving": vLLM's OpenAI server under Poisson load, SD off vs on (serving.py, servestats.py)."""
import pandas as pd

from ..data import config
from ..report import analysis, servestats
from ..report import figures as F

SOURCE = "serving"
TABLES = ("serving-latency", "serving-paired", "serving-stops", "serving-static")  # build/<profile>/<name>.csv
FIGURES = ("serving-curves", "serving-speedup")  # figures/<profile>/<name>.png|pdf
FILES = ()  # other build/<profile>/ files, besides <stem>-notes.json
READS = ("serving", "batch")  # raw studies its notebook reads ("all": every profile's runs)


def static(profile: str) -> pd.DataFrame:
    """vLLM's static-batch speedups of the batch study at the serving study's k and proposers (the other side
    of "where SD stops paying"); a profile without them gives an empty table."""
    sp, _ = analysis.safe(analysis.speedup, profile, "batch")
    cells = config.cells(config.load_study("serving", profile))
    want = {(c["proposer"], c["k"]) for c in cells if c["k"] > 0}
    if sp.empty or "engine" not in sp:
        return pd.DataFrame()
    keep = pd.Series([(p, k) in want for p, k in zip(sp["proposer"], sp["k"])], index=sp.index)
    return sp[(sp["engine"] == "vllm") & (sp["mode"] == "static") & keep].reset_index(drop=True)


def tables(profile: str):
    lat, lat_note = analysis.safe(servestats.latency, profile)
    pr, pr_note = analysis.safe(servestats.paired, profile)
    stops = servestats.stops_paying(pr) if len(pr) else pd.DataFrame()
    return ({"serving-latency": lat, "serving-paired": pr, "serving-stops": stops, "serving-static": static(profile)},
            {"serving-latency": lat_note, "serving-paired": pr_note})


def figures(out):
    return {"serving-curves": F.serving_curves(out["serving-latency"], out.profile, out.note("serving-latency")),
            "serving-speedup": F.serving_speedup(out["serving-paired"], out["serving-static"], out.profile,
                                                 out.note("serving-paired"))}
