"""Hardware profiles (configs/hardware/<name>.yaml): spec-sheet numbers and how to recognise the machine."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import yaml

from . import paths
from .errors import SpecdecError


def profile_names() -> list[str]:
    return sorted(p.stem for p in (paths.configs() / "hardware").glob("*.yaml"))


def load_profile(name: str) -> dict:
    """The profile dict; an unknown name is a one-line error listing the known ones."""
    path = paths.configs() / "hardware" / f"{name}.yaml"
    if not path.exists():
        raise SpecdecError(f"unknown hardware profile '{name}'; known: {', '.join(profile_names())}")
    try:
        prof = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecdecError(f"hardware profile {path.name} is not valid YAML: {str(e).splitlines()[0]}") from e
    prof.setdefault("name", name)
    return prof


def _cpuinfo(field: str) -> str | None:
    """The value of the first `field` line of /proc/cpuinfo (None where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where there is none)."""
    return (_cpuinfo("flags") or "").split()


def describe_machine() -> dict:
    """What this machine is: CPU model and matmul-relevant flags, cores, memory (GiB), the CUDA device if any."""
    import torch

    flags = set(cpu_flags())
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_flags": sorted(f for f in flags if f.startswith(("amx", "avx512_bf16", "avx512f", "avx2"))),
            "platform": platform.platform(), "cuda": torch.cuda.is_available()}
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    if info["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def check_machine(profile: dict, machine: dict | None = None) -> None:
    """Refuse to measure under a profile this machine is not (a one-line error)."""
    machine = machine or describe_machine()
    match = profile.get("match", {})
    if match.get("cuda") and not machine.get("cuda"):
        raise SpecdecError(f"profile '{profile['name']}' needs a CUDA GPU, but this machine has none")
    model, cores = match.get("cpu_model"), match.get("cores")
    if model and model.lower() not in str(machine.get("cpu", "")).lower() or cores and machine.get("cores") != cores:
        raise SpecdecError(f"profile '{profile['name']}' is a {cores or '?'}-core '{model or 'any CPU'}' machine; this one "
                           f"is a {machine.get('cores')}-core '{machine.get('cpu')}': make a profile of your own "
                           f"(copy configs/hardware/{profile['name']}.yaml) so runs of different CPUs never mix")
    missing = [f for f in match.get("cpu_flags", []) if f not in machine.get("cpu_flags", [])]
    if missing:
        raise SpecdecError(f"profile '{profile['name']}' needs a CPU with {', '.join(missing)}; this one "
                           f"({machine.get('cpu', '?')}) lacks it")
    want = match.get("device_name")
    if want and want.lower() not in str(machine.get("gpu", "")).lower():
        raise SpecdecError(f"profile '{profile['name']}' expects a {want} GPU, found {machine.get('gpu', 'none')}")


def device_for(profile: dict) -> str:
    return "cuda" if profile.get("kind") == "gpu" else "cpu"
