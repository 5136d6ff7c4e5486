"""Study "bench": is our engine a fair baseline? Ours vs transformers generate / assisted generation."""
from ..report import figures as F
from ..report import views

SOURCE = "bench"
TABLES = ("bench-vs-hf",)  # build/<gpu>/<name>.csv
FIGURES = ("bench-vs-hf",)  # figures/<gpu>/<name>.png|pdf
FILES = ()  # other build/<gpu>/ files, besides <stem>-notes.json
READS = ("bench",)  # raw studies its notebook reads ("all": every profile's runs)


def tables(gpu: str):
    bn, note = views.bench(gpu)
    return {"bench-vs-hf": bn}, {"bench-vs-hf": note}


def figures(out):
    return {"bench-vs-hf": F.bench_vs_hf(out["bench-vs-hf"], out.gpu, out.note("bench-vs-hf"))}
