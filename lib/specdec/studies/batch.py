"""Study "batch": SD speedup vs batch size and k under static batching (draft model and n-gram proposers)."""
from ..report import figures as F
from ..report import views

SOURCE = "batch"
TABLES = ("batch-speedup", "batch-overhead", "batch-contention", "batch-engines", "batch-roofline",
          "batch-vllm-steps")  # build/<gpu>/<name>.csv
FIGURES = ("batch-speedup", "batch-throughput", "batch-overhead", "batch-engines")  # figures/<gpu>/<name>.png|pdf
FILES = ()  # other build/<gpu>/ files, besides <stem>-notes.json
READS = ("batch",)  # raw studies its notebook reads ("all": every profile's runs)


def tables(gpu: str):
    ov, ov_note = views.draft_overhead(gpu)
    eng, eng_note = views.engines(gpu)
    roof, roof_note = views.roofline(gpu)
    vst, vst_note = views.vllm_steps(gpu)
    return ({"batch-speedup": views.speedup(gpu), "batch-overhead": ov, "batch-contention": views.contention(gpu),
             "batch-engines": eng, "batch-roofline": roof, "batch-vllm-steps": vst},
            {"batch-overhead": ov_note, "batch-engines": eng_note, "batch-roofline": roof_note,
             "batch-vllm-steps": vst_note})


def figures(out):
    sp, gpu = out["batch-speedup"], out.gpu
    return {"batch-speedup": F.batch_speedup(sp, gpu), "batch-throughput": F.batch_throughput(sp, gpu),
            "batch-overhead": F.batch_overhead(out["batch-overhead"], gpu, out.note("batch-overhead")),
            "batch-engines": F.batch_engines(out["batch-engines"], gpu, out.note("batch-engines"))}
