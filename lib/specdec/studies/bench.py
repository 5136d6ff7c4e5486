"""Study "bench": is our engine a fair baseline? Ours vs transformers generate / assisted generation."""
from ..report import figures as F
from ..report import views

SOURCE = "bench"
TABLES = ("bench-vs-hf",)  # build/<profile>/<name>.csv
FIGURES = ("bench-vs-hf",)  # figures/<profile>/<name>.png|pdf
FILES = ()  # other build/<profile>/ files, besides <stem>-notes.json
READS = ("bench",)  # raw studies its notebook reads ("all": every profile's runs)


def tables(profile: str):
    bn, note = views.bench(profile)
    return {"bench-vs-hf": bn}, {"bench-vs-hf": note}


def figures(out):
    return {"bench-vs-hf": F.bench_vs_hf(out["bench-vs-hf"], out.profile, out.note("bench-vs-hf"))}
