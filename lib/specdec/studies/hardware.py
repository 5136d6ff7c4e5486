"""Study "hardware": forward-pass cost of target and draft, draft overhead per profile."""
from ..model import costmodel
from ..report import analysis, fidelity, views
from ..report import figures as F

SOURCE = "hardware"
TABLES = ("hardware-forward", "hardware-overhead", "hardware-profiles", "hardware-profile-status",
          "hardware-costfit-cv", "hardware-bandwidth", "hardware-costfit")  # build/<profile>/<name>.csv
FIGURES = ("hardware-forward", "hardware-overhead", "hardware-profiles")  # figures/<profile>/<name>.png|pdf
FILES = ()  # other build/<profile>/ files, besides <stem>-notes.json
READS = ("hardware",)  # raw studies its notebook reads ("all": every profile's runs)


def tables(profile: str):
    ac, ac_note = analysis.safe(analysis.overhead_across_profiles)
    cv, cv_note = analysis.safe(costmodel.cross_validate, profile)
    bw, bw_note = analysis.safe(fidelity.bandwidth, profile)
    cf, cf_note = analysis.safe(costmodel.compare_target, profile)
    return ({"hardware-forward": views.forward_times(profile), "hardware-overhead": views.forward_ratio(profile),
             "hardware-profiles": ac, "hardware-profile-status": analysis.profile_status(),
             "hardware-costfit-cv": cv, "hardware-bandwidth": bw, "hardware-costfit": cf},
            {"hardware-profiles": ac_note, "hardware-costfit-cv": cv_note, "hardware-bandwidth": bw_note,
             "hardware-costfit": cf_note})


def figures(out):
    return {"hardware-forward": F.hardware_forward(out["hardware-forward"], out.profile),
            "hardware-overhead": F.hardware_overhead(out["hardware-overhead"], out.profile),
            "hardware-profiles": F.hardware_profiles(out["hardware-profiles"], out.note("hardware-profiles"))}
