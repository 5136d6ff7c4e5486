"""Study "batch": SD speedup vs batch size and k under static batching (draft model and n-gram proposers)."""
from ..report import figures as F
from ..report import views

SOURCE = "batch"
TABLES = ("batch-speedup", "batch-overhead", "batch-contention", "batch-engines", "batch-roofline",
          "batch-vllm-steps")  # build/<profile>/<name>.csv
FIGURES = ("batch-speedup", "batch-throughput", "batch-overhead", "batch-engines")  # figures/<profile>/<name>.png|pdf
FILES = ()  # other build/<profile>/ files, besides <stem>-notes.json
READS = ("batch",)  # raw studies its notebook reads ("all": every profile's runs)


def tables(profile: str):
    ov, ov_note = views.draft_overhead(profile)
    eng, eng_note = views.engines(profile)
    roof, roof_note = views.roofline(profile)
    vst, vst_note = views.vllm_steps(profile)
    return ({"batch-speedup": views.speedup(profile), "batch-overhead": ov, "batch-contention": views.contention(profile),
             "batch-engines": eng, "batch-roofline": roof, "batch-vllm-steps": vst},
            {"batch-overhead": ov_note, "batch-engines": eng_note, "batch-roofline": roof_note,
             "batch-vllm-steps": vst_note})


def figures(out):
    sp, profile = out["batch-speedup"], out.profile
    return {"batch-speedup": F.batch_speedup(sp, profile), "batch-throughput": F.batch_throughput(sp, profile),
            "batch-overhead": F.batch_overhead(out["batch-overhead"], profile, out.note("batch-overhead")),
            "batch-engines": F.batch_engines(out["batch-engines"], profile, out.note("batch-engines"))}
