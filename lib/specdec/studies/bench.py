"""Study "bench": is our engine a fair baseline? Ours vs transformers generate / assisted generation."""
from .. import figures as F
from .. import views

SOURCE = "bench"


def tables(gpu: str):
    bn, note = views.bench(gpu)
    return {"bench-vs-hf": bn}, {"bench-vs-hf": note}


def figures(out):
    return {"bench-vs-hf": F.bench_vs_hf(out["bench-vs-hf"], out.gpu, out.note("bench-vs-hf"))}
