"""Study configs (configs/<study>.yaml): load, validate, apply a hardware profile's overrides, expand cells.

A cell is one point of the grid and becomes one immutable raw folder. Keys of a cell:
  batch (sequences per batch; max concurrent in poisson mode), k (proposed tokens; 0 = no speculation),
  proposer (draft | ngram | none), temperature, alpha (synthetic acceptance, or null), quant (none | int8),
  rate (Poisson arrivals per second, poisson mode only), context (KV tokens, forward mode only),
  requests (requests per static cell, overriding prompts.min_requests; null = the study's value),
  mode: static (fixed batches) | poisson (continuous batching, Poisson arrivals) | forward (timed forward
  passes of target and draft with k+1 query tokens per sequence: the cost-model microbenchmark) |
  offload (forward mode for the target alone, its weights in host memory and copied to the device layer by
  layer in every forward, as accelerate's CPU offload does) |
  hf (our engine vs transformers' generate / assisted generation on the same prompts: the bench study) |
  serve (vLLM's OpenAI server under Poisson load at `rate` requests/s, `batch` = its max_num_seqs: the
  serving study, serving.py),
  trace (with generation.acceptance_trace: the dataset of that collection this cell replays; null = its own).
`grid` is one mapping of lists or a list of such mappings (their union).
"""
from __future__ import annotations

import copy
import fnmatch
import hashlib
import itertools
import json

import yaml

from .. import paths
from ..errors import SpecdecError
from .hardware import load_profile, profile_names
from .spec import LEGACY_MATCH, MATCH_RULES, PROPOSERS, Study, staged_split

GRID_KEYS = ("mode", "batch", "k", "proposer", "temperature", "alpha", "quant", "rate", "context", "requests",
             "trace")
DEFAULTS = {"mode": ["static"], "proposer": ["draft"], "temperature": [0.0], "alpha": [None], "quant": ["none"],
            "rate": [None], "context": [None], "requests": [None], "trace": [None]}
MODES = ("static", "poisson", "forward", "offload", "hf", "serve")
FORWARD_MODES = ("forward", "offload")  # timed forward passes (hardware study), not generation
# Runs measured before `generation.ngram_match` existed used the latest match (spec.LEGACY_MATCH); a config
# without the key means that, and config_hash leaves the key out when it says so, so those runs keep their hash.


def study_names() -> list[str]:
    return sorted(p.stem for p in paths.configs().glob("*.yaml"))


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, val in over.items():
        out[key] = _merge(out[key], val) if isinstance(val, dict) and isinstance(out.get(key), dict) else val
    return out


def load_study(study: str, profile: str | None = None) -> dict:
    """The study config with `profiles.<profile>` merged in; bad files are one-line errors."""
    path = paths.configs() / f"{study}.yaml"
    if not path.exists():
        raise SpecdecError(f"unknown study '{study}'; known: {', '.join(study_names())}")
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecdecError(f"config {path.name} is not valid YAML: {str(e).splitlines()[0]}") from e
    if not isinstance(cfg, dict) or not isinstance(cfg.get("grid"), (dict, list)):
        raise SpecdecError(f"config {path.name} needs a mapping with a 'grid'")
    overrides = cfg.pop("profiles", {}) or {}
    if not isinstance(overrides, dict):
        raise SpecdecError(f"config {path.name}: 'profiles' must map profile names to overrides")
    unknown = sorted(set(overrides) - set(profile_names()))
    if unknown:
        raise SpecdecError(f"config {path.name}: unknown profile(s) {unknown} under 'profiles'; known: "
                           f"{', '.join(profile_names())}")
    for prof, over in overrides.items():  # values of every profile checked, not only the one measured now
        if not isinstance(over, dict):
            raise SpecdecError(f"config {path.name}: profiles.{prof} must be a mapping of overrides")
        _check_values(over, f"{path.name} profiles.{prof}")
    _check_values(cfg, path.name)
    if profile and profile in overrides:
        cfg = _merge(cfg, overrides[profile])
    cfg["study"] = study
    cfg["profile"] = profile
    validate(cfg, path.name)
    Study.from_dict(cfg)  # unknown or misspelt keys are one-line errors
    return cfg


_ANALYSIS: dict = {}


def analysis_settings(study: str, profile: str) -> dict:
    """The analysis-only settings of a study on a profile, left out of the config hash: `calibration` (run-id
    patterns of the cells that calibrate the cost model, costmodel.fit_steps) and `warmup_batches` (each run's
    first timed batches that analysis leaves out). Cached per config file version (analysis asks on every load);
    a profile without a yaml gets neither."""
    path = paths.configs() / f"{study}.yaml"
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.exists() else None
    key = (str(path), stamp, profile)
    if key not in _ANALYSIS:
        cfg = load_study(study, profile) if profile in profile_names() else {}
        _ANALYSIS[key] = {"calibration": tuple(cfg.get("calibration") or ()),
                          "warmup_batches": int((cfg.get("timing") or {}).get("warmup_batches") or 0)}
    return _ANALYSIS[key]


def select(cells: list[dict], only: str | None, study: str) -> list[dict]:
    """The cells whose id (cell_id) matches the shell pattern `only`, or one of its comma-separated patterns
    (all cells when None); no match is an error."""
    if only is None:
        return cells
    out = [c for c in cells if any(fnmatch.fnmatch(cell_id(c), p.strip()) for p in only.split(","))]
    if not out:
        raise SpecdecError(f"--only '{only}' matches no cell of study '{study}' (cell ids look like "
                           f"{cell_id(cells[0]) if cells else 'bs1-k3-draft-t0'})")
    return out


def grids(cfg: dict) -> list[dict]:
    return cfg["grid"] if isinstance(cfg["grid"], list) else [cfg["grid"]]


DTYPES = ("float32", "bfloat16", "float16", "float64", "auto")  # "auto": vLLM picks (the torch engine needs one)


def _check_values(cfg: dict, name: str) -> None:
    """The pair and dtypes of a config or of one profile's overrides: unknown ones are one-line errors."""
    from .models import pair_spec
    if "pair" in cfg:
        try:
            pair_spec(cfg["pair"])
        except SpecdecError as e:
            raise SpecdecError(f"{name}: {e}") from None
    for key in ("dtype", "draft_dtype"):
        if cfg.get(key) is not None and cfg[key] not in DTYPES:
            raise SpecdecError(f"{name}: {key} must be one of {', '.join(DTYPES)}, got {cfg[key]!r}")


def _check_trace(spec, name: str) -> None:
    """generation.acceptance_trace: COLLECTION/DATASET of an imported collection, never a held-out dataset."""
    from . import traces
    coll, _, dataset = str(spec).partition("/")
    if not dataset:
        raise SpecdecError(f"{name}: generation.acceptance_trace must be COLLECTION/DATASET, got {spec!r}")
    known = traces.datasets(coll)  # an unknown collection is a one-line error
    if dataset not in known:
        raise SpecdecError(f"{name}: collection '{coll}' has no dataset '{dataset}'; known: {', '.join(known)}")
    if dataset in traces.datasets(coll, held_out=True):
        raise SpecdecError(f"{name}: '{dataset}' is held out in '{coll}'; replay a build-and-test dataset "
                           f"({', '.join(traces.datasets(coll, held_out=False))})")


def validate(cfg: dict, name: str = "config") -> None:
    for grid in grids(cfg):
        _validate_grid(grid, name)
    _check_values(cfg, name)
    gen = cfg.get("generation", {})
    if gen.get("acceptance_trace") is not None:
        _check_trace(gen["acceptance_trace"], name)
    datasets = {d for g in grids(cfg) for d in g.get("trace", []) if d is not None}
    if datasets and gen.get("acceptance_trace") is None:
        raise SpecdecError(f"{name}: grid.trace needs generation.acceptance_trace (COLLECTION/DATASET)")
    for d in sorted(datasets):
        _check_trace(f"{str(gen['acceptance_trace']).partition('/')[0]}/{d}", name)
    if gen.get("max_new_tokens", 1) < 1:
        raise SpecdecError(f"{name}: generation.max_new_tokens must be >= 1")
    if gen.get("ngram_match", LEGACY_MATCH) not in MATCH_RULES:
        raise SpecdecError(f"{name}: generation.ngram_match must be one of {', '.join(MATCH_RULES)}, "
                           f"got {gen.get('ngram_match')!r}")


def _validate_grid(grid: dict, name: str) -> None:
    if not isinstance(grid, dict):
        raise SpecdecError(f"{name}: each grid must be a mapping of lists")
    unknown = set(grid) - set(GRID_KEYS)
    if unknown:
        raise SpecdecError(f"{name}: unknown grid keys {sorted(unknown)}; allowed: {', '.join(GRID_KEYS)}")
    for key in ("batch", "k"):
        if key not in grid or not grid[key]:
            raise SpecdecError(f"{name}: grid.{key} must list at least one value")
    if any((not isinstance(b, int)) or b < 1 for b in grid["batch"]):
        raise SpecdecError(f"{name}: batch sizes must be integers >= 1, got {grid['batch']}")
    if any((not isinstance(k, int)) or k < 0 for k in grid["k"]):
        raise SpecdecError(f"{name}: k must be integers >= 0, got {grid['k']}")
    for p in grid.get("proposer", []):
        if p not in PROPOSERS:
            raise SpecdecError(f"{name}: unknown proposer '{p}'")
    for a in grid.get("alpha", []):
        if a is not None and not 0 <= a <= 1:
            raise SpecdecError(f"{name}: alpha must be in [0, 1], got {a}")
    for key, vals in grid.items():
        if not isinstance(vals, list) or not vals:
            raise SpecdecError(f"{name}: grid.{key} must be a non-empty list")
    modes = grid.get("mode", ["static"])
    if any(m not in MODES for m in modes):
        raise SpecdecError(f"{name}: mode must be one of {', '.join(MODES)}, got {modes}")
    for mode in {"poisson", "serve"} & set(modes):
        if any(r is None or isinstance(r, bool) or not isinstance(r, (int, float)) or not r > 0
               for r in grid.get("rate", [None])):
            raise SpecdecError(f"{name}: {mode} mode needs grid.rate > 0 (requests per second)")
    if "serve" in modes and len(modes) > 1:
        raise SpecdecError(f"{name}: serve cells run on vLLM's server; give them a grid of their own")
    if set(modes) & set(FORWARD_MODES) and any(c is None or c < 1 for c in grid.get("context", [None])):
        raise SpecdecError(f"{name}: forward and offload modes need grid.context >= 1 (KV tokens)")


def cells(cfg: dict) -> list[dict]:
    """Every grid point, k=0 collapsed to proposer 'none' (and alpha null), duplicates removed, in order."""
    seen, out = set(), []
    for spec in grids(cfg):
        grid = {key: spec.get(key, DEFAULTS.get(key)) for key in GRID_KEYS}
        for values in itertools.product(*(grid[key] for key in GRID_KEYS)):
            cell = dict(zip(GRID_KEYS, values))
            if cell["mode"] in FORWARD_MODES:
                cell.update(proposer="draft", alpha=None)
            elif cell["k"] == 0 or cell["proposer"] == "none":
                cell.update(k=0, proposer="none", alpha=None)
            key = cell_id(cell)
            if key not in seen:
                seen.add(key)
                out.append(cell)
    return out


def is_serving(cfg: dict) -> bool:
    """Whether a study's cells are served (mode serve: serving.py runs them), not run by an engine in-process."""
    modes = {c["mode"] for c in cells(cfg)}
    return "serve" in modes


def cell_id(cell: dict) -> str:
    """A readable, unique folder name for a cell, e.g. bs8-k3-draft-t0-int8."""
    if cell.get("mode") in FORWARD_MODES:
        return f"{'fwd' if cell['mode'] == 'forward' else 'off'}-bs{cell['batch']}-q{cell['k'] + 1}-ctx{cell['context']}"
    parts = [f"bs{cell['batch']}", f"k{cell['k']}", cell["proposer"], f"t{cell['temperature']:g}"]
    if cell.get("mode") in ("poisson", "hf", "serve"):
        parts.insert(0, {"poisson": "cb", "hf": "hf", "serve": "srv"}[cell["mode"]])
    if cell.get("alpha") is not None:
        parts.append(f"a{cell['alpha']:g}")
    if cell.get("quant", "none") != "none":
        parts.append(cell["quant"])
    if cell.get("rate") is not None:
        parts.append(f"r{cell['rate']:g}")
    if cell.get("requests") is not None:
        parts.append(f"n{cell['requests']}")
    if cell.get("trace") is not None:
        parts.append(str(cell["trace"]))
    return "-".join(parts)


def run_name(cell: dict, chash: str, engine: str = "torch") -> str:
    """A cell's raw run folder name: `<cell id>-<hash[:8]>`, and `<cell id>-vllm-<hash[:8]>` for vLLM runs, where
    chash is config_hash of the config the run measures (its engine's view, or next_view for staged runs)."""
    return f"{cell_id(cell)}-{'vllm-' if engine == 'vllm' else ''}{chash[:8]}"


def engine_view(cfg: dict, engine: str) -> dict:
    """The study config as `engine` runs it: for vLLM, a study config without its own `vllm` section takes the
    hardware profile's (`vllm:` in configs/hardware/<profile>.yaml: how vLLM fits that machine, e.g. its memory),
    so it is in the vLLM runs' config, hash and meta.json; the torch engine's view is the config itself."""
    if engine != "vllm" or "vllm" in cfg or not cfg.get("profile"):
        return cfg
    if cfg["profile"] not in profile_names():
        return cfg
    own = load_profile(cfg["profile"]).get("vllm")
    return {**cfg, "vllm": own} if own else cfg


def next_view(cfg: dict) -> dict:
    """The config as `measure --next` runs it: `torch` merged with the staged `torch_next`, which is dropped.
    That is the config after promotion (move torch_next's keys into torch, delete torch_next), so the runs
    measured now are current once it is promoted; until then analysis ignores them (their hash differs).
    A `timing` mapping inside torch_next stages timing keys the same way (e.g. `paired: true` for a profile
    only the torch engine measures): it is merged into the top-level `timing`, and promotion moves it there."""
    where = f"config {cfg.get('study', '?')}.yaml, profile {cfg.get('profile')}"
    nxt = cfg.get("torch_next")
    if not nxt:
        raise SpecdecError(f"{where} stages no torch_next: nothing for --next to measure")
    if not isinstance(nxt, dict):
        raise SpecdecError(f"{where}: torch_next must be a mapping of torch settings, got {nxt!r}")
    nxt, timing = staged_split(nxt)
    if not isinstance(timing, dict):
        raise SpecdecError(f"{where}: torch_next.timing must be a mapping of timing settings, got {timing!r}")
    now, now_timing = dict(cfg.get("torch") or {}), dict(cfg.get("timing") or {})
    if {**now, **nxt} == now and {**now_timing, **timing} == now_timing:
        raise SpecdecError(f"{where}: torch_next changes nothing in torch ({now}) or timing")
    out = {k: v for k, v in cfg.items() if k != "torch_next"}
    out["torch"] = {**now, **nxt}
    if timing:
        out["timing"] = {**now_timing, **timing}
    return out


def config_hash(cfg: dict, engine: str = "torch") -> str:
    """sha256 of the config minus the grid (so growing a grid keeps finished cells valid), minus `calibration`,
    `slo` and timing.warmup_batches (what analysis does with the runs, not how they were measured), and minus
    generation.ngram_match when it is the legacy "latest" (runs from before the key keep their hash), and minus
    `torch_next` (settings staged for re-measurement, next_view: staging them invalidates no run).

    Engine-scoped sections: `torch` (torch-engine settings, e.g. the Linear path) is left out of vLLM runs'
    hash, so a change there restarts only torch runs; a study without a `vllm` section is hashed for vLLM with its
    hardware profile's (engine_view). The torch engine's hash still covers the study's own `vllm` section,
    as every run's hash did before the `torch` section existed: without a `torch` section, hashes are unchanged."""
    if engine not in ("torch", "vllm"):
        raise ValueError(f"unknown engine '{engine}'")
    body = {k: v for k, v in engine_view(cfg, engine).items()
            if k not in ("grid", "calibration", "slo", "torch_next") and not (engine == "vllm" and k == "torch")}
    timing = body.get("timing")
    if isinstance(timing, dict) and "warmup_batches" in timing:  # what analysis counts, not what is measured
        body["timing"] = {k: v for k, v in timing.items() if k != "warmup_batches"}
    gen = body.get("generation")
    if isinstance(gen, dict) and gen.get("ngram_match") == LEGACY_MATCH:
        body["generation"] = {k: v for k, v in gen.items() if k != "ngram_match"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
