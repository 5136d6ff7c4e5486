"""Study "batch": SD speedup vs batch size and k under static batching (draft model and n-gram proposers)."""
from .. import figures as F
from .. import views

SOURCE = "batch"


def tables(gpu: str):
    ov, ov_note = views.draft_overhead(gpu)
    return ({"batch-speedup": views.speedup(gpu), "batch-overhead": ov, "batch-contention": views.contention(gpu)},
            {"batch-overhead": ov_note})


def figures(out):
    sp, gpu = out["batch-speedup"], out.gpu
    return {"batch-speedup": F.batch_speedup(sp, gpu), "batch-throughput": F.batch_throughput(sp, gpu),
            "batch-overhead": F.batch_overhead(out["batch-overhead"], gpu, out.note("batch-overhead"))}
