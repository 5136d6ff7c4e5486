"""Hardware profiles (configs/hardware/<name>.yaml): spec-sheet numbers and how to recognise the machine."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import yaml

from .. import paths
from ..errors import SpecdecError


def profile_names() -> list[str]:
    return sorted(p.stem for p in (paths.configs() / "hardware").glob("*.yaml"))


def load_profile(name: str) -> dict:
    """The profile's yaml, loaded and checked (callers name it `hw`; `profile` is always the name); an unknown
    name is a one-line error listing the known ones."""
    path = paths.configs() / "hardware" / f"{name}.yaml"
    if not path.exists():
        raise SpecdecError(f"unknown hardware profile '{name}'; known: {', '.join(profile_names())}")
    try:
        prof = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecdecError(f"hardware profile {path.name} is not valid YAML: {str(e).splitlines()[0]}") from e
    return validate_profile(prof, path.name, name)


# key: (allowed types, required). Numbers are int or float (not bool); None where the value may be unknown.
_NUM = (int, float)
PROFILE_KEYS = {"name": ((str,), False), "kind": ((str,), True), "match": ((dict,), True),
                "description": ((str,), False), "peak_tflops": (_NUM + (type(None),), False),
                "mem_bw_tbs": (_NUM + (type(None),), False), "memory_gib": (_NUM + (type(None),), False),
                "source": ((str,), False), "costs": ((dict,), False),
                # CPU offloading: the target's weights live in host memory and cross this link (TB/s) in every
                # forward (costmodel.prior); the draft stays resident
                "offload_link_tbs": (_NUM + (type(None),), False),
                # vLLM engine settings for studies that have no `vllm:` section of their own (config.engine_view)
                "vllm": ((dict,), False)}
MATCH_KEYS = {"cuda": (bool,), "cpu_model": (str,), "cores": (int,), "cpu_flags": (list,), "device_name": (str,)}
KINDS = ("cpu", "gpu")


def _typed(val, types: tuple) -> bool:
    return isinstance(val, types) and not (isinstance(val, bool) and bool not in types)


def validate_profile(prof, file: str, name: str) -> dict:
    """A hardware profile checked like spec.Study: unknown keys, wrong types and missing fields are one-line
    errors (a misspelt `match:` would turn the machine check off, a misspelt `kind:` make a GPU a CPU)."""
    if not isinstance(prof, dict):
        raise SpecdecError(f"hardware profile {file} must be a mapping of keys, got {type(prof).__name__}")
    unknown = sorted(set(prof) - set(PROFILE_KEYS))
    if unknown:
        raise SpecdecError(f"hardware profile {file}: unknown key(s) {unknown}; allowed: {', '.join(PROFILE_KEYS)}")
    for key, (types, required) in PROFILE_KEYS.items():
        if key not in prof:
            if required:
                raise SpecdecError(f"hardware profile {file}: missing required key '{key}'")
            continue
        if not _typed(prof[key], types):
            raise SpecdecError(f"hardware profile {file}: '{key}' must be {' or '.join(t.__name__ for t in types)},"
                               f" got {prof[key]!r}")
    if prof["kind"] not in KINDS:
        raise SpecdecError(f"hardware profile {file}: kind must be one of {', '.join(KINDS)}, got {prof['kind']!r}")
    for key in ("peak_tflops", "mem_bw_tbs", "memory_gib", "offload_link_tbs"):
        if prof.get(key) is not None and not prof[key] > 0:
            raise SpecdecError(f"hardware profile {file}: '{key}' must be > 0, got {prof[key]!r}")
    match = prof["match"]
    unknown = sorted(set(match) - set(MATCH_KEYS))
    if unknown:
        raise SpecdecError(f"hardware profile {file}: unknown match key(s) {unknown}; allowed: {', '.join(MATCH_KEYS)}")
    for key, types in MATCH_KEYS.items():
        if key in match and not _typed(match[key], types):
            raise SpecdecError(f"hardware profile {file}: match.{key} must be {types[0].__name__}, got {match[key]!r}")
    if not all(isinstance(f, str) for f in match.get("cpu_flags", [])):
        raise SpecdecError(f"hardware profile {file}: match.cpu_flags must be a list of flag names")
    if prof.get("name", name) != name:
        raise SpecdecError(f"hardware profile {file}: name '{prof['name']}' differs from the file name '{name}'")
    return dict(prof, name=name)


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


def check_machine(hw: dict, machine: dict | None = None) -> None:
    """Refuse to measure under a profile this machine is not (a one-line error)."""
    machine = machine or describe_machine()
    match = hw.get("match", {})
    if match.get("cuda") and not machine.get("cuda"):
        raise SpecdecError(f"profile '{hw['name']}' needs a CUDA GPU, but this machine has none")
    model, cores = match.get("cpu_model"), match.get("cores")
    if model and model.lower() not in str(machine.get("cpu", "")).lower() or cores and machine.get("cores") != cores:
        raise SpecdecError(f"profile '{hw['name']}' is a {cores or '?'}-core '{model or 'any CPU'}' machine; this one "
                           f"is a {machine.get('cores')}-core '{machine.get('cpu')}': make a profile of your own "
                           f"(copy configs/hardware/{hw['name']}.yaml) so runs of different CPUs never mix")
    missing = [f for f in match.get("cpu_flags", []) if f not in machine.get("cpu_flags", [])]
    if missing:
        raise SpecdecError(f"profile '{hw['name']}' needs a CPU with {', '.join(missing)}; this one "
                           f"({machine.get('cpu', '?')}) lacks it")
    want = match.get("device_name")
    if want and want.lower() not in str(machine.get("gpu", "")).lower():
        raise SpecdecError(f"profile '{hw['name']}' expects a {want} GPU, found {machine.get('gpu', 'none')}")


def device_for(hw: dict) -> str:
    """"cuda" for a GPU profile's loaded yaml, else "cpu"."""
    return "cuda" if hw.get("kind") == "gpu" else "cpu"
