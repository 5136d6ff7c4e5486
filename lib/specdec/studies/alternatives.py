"""Study "alternatives": SD vs int8 quantization vs static and continuous batching."""
from ..report import analysis, views
from ..report import figures as F

SOURCE = "alternatives"
TABLES = ("alternatives-compare", "alternatives-latency", "alternatives-serving")  # build/<profile>/<name>.csv
FIGURES = ("alternatives-compare", "alternatives-latency")  # figures/<profile>/<name>.png|pdf
FILES = ()  # other build/<profile>/ files, besides <stem>-notes.json
READS = ("alternatives",)  # raw studies its notebook reads ("all": every profile's runs)


def tables(profile: str):
    alt, alt_note = views.alternatives(profile)
    lat, lat_note = analysis.safe(analysis.latency, profile, "alternatives")
    srv, _ = analysis.safe(analysis.serving_throughput, profile, "alternatives")
    return ({"alternatives-compare": alt, "alternatives-latency": lat, "alternatives-serving": srv},
            {"alternatives-compare": alt_note, "alternatives-latency": lat_note})


def figures(out):
    return {"alternatives-compare": F.alternatives_compare(out["alternatives-compare"], out.profile,
                                                           out.note("alternatives-compare")),
            "alternatives-latency": F.alternatives_latency(out["alternatives-latency"], out.profile,
                                                           out.note("alternatives-latency"))}
