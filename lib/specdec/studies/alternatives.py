"""Study "alternatives": SD vs int8 quantization vs static and continuous batching."""
from .. import analysis, views
from .. import figures as F

SOURCE = "alternatives"


def tables(gpu: str):
    alt, alt_note = views.alternatives(gpu)
    lat, lat_note = analysis.safe(analysis.latency, gpu, "alternatives")
    srv, _ = analysis.safe(analysis.serving_throughput, gpu, "alternatives")
    return ({"alternatives-compare": alt, "alternatives-latency": lat, "alternatives-serving": srv},
            {"alternatives-compare": alt_note, "alternatives-latency": lat_note})


def figures(out):
    return {"alternatives-compare": F.alternatives_compare(out["alternatives-compare"], out.gpu,
                                                           out.note("alternatives-compare")),
            "alternatives-latency": F.alternatives_latency(out["alternatives-latency"], out.gpu,
                                                           out.note("alternatives-latency"))}
