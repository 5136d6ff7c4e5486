"""Run a study grid with vLLM (CPU build vllm-cpu 0.32.0 here, or a CUDA build on GPU machines) and write the
same raw format as the torch harness.

Models load from local folders where the pair has them (the converted GGUF folders in the model cache, the
saved tiny-vllm pair), else from hub ids. Prompts go in as token ids (skip_tokenizer_init). Under
`timing.paired` a base engine (no speculation) stays alive beside the SD engine and every timed batch runs on
both, interleaved (pairing.py). Extra engine settings come from the study config's `vllm:` mapping; its `env`
entry (e.g. VLLM_CPU_KVCACHE_SPACE, GiB of KV cache on the CPU) is set in the environment before an engine
starts.

Written against vLLM's V1 engine as found in vLLM main (latest PyPI release when checked: 0.34.0):
  * LLM(model=..., speculative_config={...}, max_num_seqs=..., seed=..., quantization=..., disable_log_stats=False)
    - speculative_config["method"]: "draft_model" (needs model), "ngram" (prompt_lookup_max/min),
      "eagle" / "eagle3" (model = the EAGLE head); num_speculative_tokens = k;
      "quantization" inside speculative_config quantizes the draft model (draft_model method only).
    - draft_model in V1 came with vLLM PR #24322; vLLM 0.13.0 still raised NotImplementedError for it.
  * SamplingParams(temperature=..., max_tokens=..., ignore_eos=...).
  * LLM.get_metrics() -> list of vllm.v1.metrics.reader.{Counter(.value), Vector(.values), Gauge, Histogram}
    with the process-cumulative counters vllm:spec_decode_num_drafts, vllm:spec_decode_num_draft_tokens,
    vllm:spec_decode_num_accepted_tokens and the vector vllm:spec_decode_num_accepted_tokens_per_pos
    (only recorded when disable_log_stats=False). A cell's counters are the difference of two snapshots.
  * RequestOutput.metrics: RequestStateStats (arrival_time wall clock; scheduled_ts, first_token_ts,
    last_token_ts engine-core time.monotonic()), or None.

Only static-mode cells run here; poisson (continuous batching with arrivals) and forward (microbenchmark)
cells, synthetic acceptance (alpha) and int8 have no vLLM equivalent in this runner and are reported and
skipped. vllm is imported only inside the GPU path. Times are seconds.
"""
from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import sys
import time

import pandas as pd

from ..data import config as cfgmod
from ..data import hardware, models, rawdata
from ..data.spec import Cell, Study, proposer_names
from ..errors import SpecdecError
from . import pairing, probe, vllm_share, vllm_steps
from .plan import plan

MISSING = ("the vLLM engine needs the vllm package: `make venv` installs vllm-cpu 0.32.0 into .venv "
           "(GPU machines: pip install 'specdec[gpu]')")
PROPOSERS = proposer_names("vllm")
COUNTERS = {"vllm:spec_decode_num_drafts": "num_drafts",
            "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
TIMING_NOTES = ("vLLM engine: batches.call_s is the wall time of one LLM.generate call; prefill_s = the latest "
                "first-token time of its requests and decode_s = call_s - prefill_s (as the torch engine's "
                "decode_s, prefill excluded); where vLLM gives no per-request stamps prefill_s is NaN and "
                "decode_s = call_s; steps unknown (NaN); no steps table; prefix caching off; with an in-process "
                "engine, step_s/verify_s/draft_s/other_s (s) and engine_steps are the call's step-time split "
                "(vllm_steps.py, prefill steps included), else NaN")


# ---------------------------------------------------------------- config translation (pure, CPU)

LOCAL = (models.GgufSource, models.TinySource)


def _hub_ids(st: Study, resolve: bool = False) -> tuple[str, str]:
    """(target, draft) as vLLM loads them: local folders for pairs that have them (resolved, i.e. converted or
    saved, only when `resolve`; else a placeholder "local:<name>"), else the pair's hub ids."""
    spec = models.pair_spec(st.pair)
    if isinstance(spec.target, LOCAL):
        return tuple(models.model_dir(src) if resolve else f"local:{src.name}" for src in (spec.target, spec.draft))
    if not spec.hub_target:
        raise SpecdecError(f"pair '{spec.name}' has neither local model folders nor a hub model id")
    return spec.hub_target, spec.hub_draft


def speculative_config(st: Study, cell: dict, resolve: bool = False) -> dict | None:
    """vLLM's speculative_config dict for a cell, or None without speculation (k=0 or proposer none)."""
    k, proposer = cell["k"], cell["proposer"]
    if proposer not in PROPOSERS:
        raise SpecdecError(f"unknown proposer '{proposer}' for the vLLM engine ({', '.join(PROPOSERS)})")
    if k == 0 or proposer == "none":
        return None
    gen = st.generation
    if proposer == "ngram":
        if gen.ngram_match != "earliest":
            raise SpecdecError("vLLM's n-gram proposer copies the earliest of the longest matches; set "
                               "generation.ngram_match: earliest for a vLLM run")
        return {"method": "ngram", "num_speculative_tokens": k,
                "prompt_lookup_max": gen.ngram_max, "prompt_lookup_min": gen.ngram_min}
    _, draft = _hub_ids(st, resolve)
    if not draft:
        raise SpecdecError(f"pair '{st.pair}' has no hub draft id for proposer '{proposer}'")
    is_eagle = "eagle" in draft.lower()
    if proposer == "draft":
        if is_eagle:
            raise SpecdecError(f"draft '{draft}' is an EAGLE head; use proposer eagle or eagle3, not draft")
        vocab = models.pair_spec(st.pair).vocab
        if vocab and vocab[0] != vocab[1]:
            raise SpecdecError(f"pair '{st.pair}': vLLM rejects a draft model whose vocabulary ({vocab[1]}) "
                               f"differs from the target's ({vocab[0]})")
        out = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
        if cell.get("quant", "none") == "fp8":
            out["quantization"] = "fp8"
        return out
    if not is_eagle or (proposer == "eagle3") != ("eagle3" in draft.lower()):
        raise SpecdecError(f"proposer '{proposer}' needs an {proposer.upper()} head as the pair's draft, "
                           f"got '{draft}'")
    return {"method": proposer, "model": draft, "num_speculative_tokens": k}


# vLLM's SpeculativeConfig (vllm/config/speculative.py; docs "Configuration Reference" of --speculative-config):
# `method` is one of SpeculativeMethod, `num_speculative_tokens` a positive int, model-based methods name a
# `model`, and ngram needs 1 <= prompt_lookup_min <= prompt_lookup_max.
VLLM_METHODS = ("ngram", "eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "deepseek_mtp")
VLLM_SPEC_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                  "quantization", "draft_tensor_parallel_size", "max_model_len"}


def check_speculative_config(conf: dict) -> dict:
    """Raise a one-line SpecdecError where `conf` breaks vLLM's documented constraints; else return it."""
    if not isinstance(conf, dict):
        raise SpecdecError("speculative config must be a mapping")
    unknown = set(conf) - VLLM_SPEC_KEYS
    if unknown:
        raise SpecdecError(f"speculative config has keys vLLM does not accept: {', '.join(sorted(unknown))}")
    method, k = conf.get("method"), conf.get("num_speculative_tokens")
    if method not in VLLM_METHODS:
        raise SpecdecError(f"speculative config needs method in {', '.join(VLLM_METHODS)}, got {method!r}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise SpecdecError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
    if method == "ngram":
        lo, hi = conf.get("prompt_lookup_min"), conf.get("prompt_lookup_max")
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise SpecdecError(f"ngram needs 1 <= prompt_lookup_min <= prompt_lookup_max, got {lo!r}, {hi!r}")
    elif not conf.get("model"):
        raise SpecdecError(f"method '{method}' needs a draft 'model'")
    return conf


def llm_kwargs(st: Study, cell: dict, resolve: bool = False, max_num_seqs: int | None = None) -> dict:
    """Keyword arguments for vllm.LLM(...) for one cell; unsupported cells raise SpecdecError (one line).

    max_model_len (tokens) = prompts.max_prompt_tokens + generation.max_new_tokens + 64 of slack;
    max_num_seqs = the cell's batch unless given (measure passes the largest batch of the run, so one engine
    serves every batch size: a static batch is submitted whole and runs as one). A `vllm:` mapping in the
    study config (or its profile) is merged last (e.g. enforce_eager); its `env` entry is not an LLM argument
    (see engine_env)."""
    mode = cell.get("mode", "static")
    if mode not in ("static", "serve"):  # serve: the same engine behind vLLM's server (serving.py)
        raise SpecdecError(f"the vLLM engine runs static and serve cells only, not mode '{mode}'")
    if cell.get("alpha") is not None:
        raise SpecdecError(f"the vLLM engine has no synthetic acceptance (alpha={cell['alpha']})")
    target, _ = _hub_ids(st, resolve)
    quant = cell.get("quant", "none") or "none"
    if quant not in ("none", "fp8"):
        raise SpecdecError(f"quant '{quant}' has no online vLLM equivalent (use none or fp8)")
    kw = {"model": target, "max_num_seqs": max_num_seqs or cell["batch"], "seed": st.seed,
          "dtype": st.dtype or "auto", "disable_log_stats": False, "enable_prefix_caching": False,
          "skip_tokenizer_init": True,
          "max_model_len": st.prompts.max_prompt_tokens + st.generation.max_new_tokens + 64}
    if quant == "fp8":
        kw["quantization"] = "fp8"
    spec = speculative_config(st, cell, resolve)
    if spec is not None:
        kw["speculative_config"] = spec
    kw.update({key: val for key, val in st.vllm.items() if key != "env"})
    # a static batch runs whole: room for all its sequences, sized when the engine is built (resolve) for the
    # run's max_num_seqs, so engine_groups' key (unresolved, batch left out) does not split by batch size
    if resolve and "kv_cache_memory_bytes" in kw:
        kw["kv_cache_memory_bytes"] = max(int(kw["kv_cache_memory_bytes"]), kv_cache_need(st, kw))
    return kw


KV_HEADROOM = 1.1  # over the exact need: vLLM pads to whole blocks and keeps k lookahead slots per sequence


def kv_cache_need(st: Study, kw: dict) -> int:
    """Bytes of KV cache for max_num_seqs sequences of max_model_len tokens of the target and, for a draft
    model, the draft (the pair registry's ModelSize.kv_elems_per_token x the dtype's bytes, KV_HEADROOM over the
    exact need); 0 where the pair has no sizes or the dtype is not a torch dtype name (e.g. "auto")."""
    import torch
    sizes = models.pair_spec(st.pair).sizes
    dtype = getattr(torch, str(kw.get("dtype")), None)
    if sizes is None or not isinstance(dtype, torch.dtype):
        return 0
    elems = sizes[0].kv_elems_per_token
    if (kw.get("speculative_config") or {}).get("model"):
        elems += sizes[1].kv_elems_per_token
    return int(kw["max_num_seqs"] * kw["max_model_len"] * elems * dtype.itemsize * KV_HEADROOM)


def engine_env(st: Study) -> dict:
    """Environment variables the study config sets for vLLM engines (`vllm: {env: {...}}`), as strings."""
    env = st.vllm.get("env") or {}
    if not isinstance(env, dict):
        raise SpecdecError("config: vllm.env must be a mapping of environment variables")
    return {str(k): str(v) for k, v in env.items()}


def sampling_kwargs(st: Study, cell: dict, max_tokens: int | None = None) -> dict:
    """Keyword arguments for vllm.SamplingParams(...): temperature, max_tokens (new tokens), ignore_eos.

    The seed goes to LLM(seed=...), not per request (seeded requests take a slower sampling path)."""
    gen = st.generation
    return {"temperature": float(cell["temperature"]),
            "max_tokens": int(max_tokens if max_tokens is not None else gen.max_new_tokens),
            "ignore_eos": bool(gen.ignore_eos), "detokenize": False}


# ---------------------------------------------------------------- metrics (pure, duck-typed)

def spec_counters(metrics) -> dict:
    """Sum the spec-decode counters in a get_metrics() snapshot (over engines/labels).

    Accepts objects with .name and .value (counters) or .values (the per-position vector); a per-position
    metric given as one counter per position (.value with labels["position"]) is also understood."""
    out = {key: 0 for key in COUNTERS.values()}
    per_pos: list[int] = []
    for m in metrics or []:
        name = str(getattr(m, "name", ""))
        name = name[:-len("_total")] if name.endswith("_total") else name
        if name in COUNTERS:
            out[COUNTERS[name]] += int(getattr(m, "value", 0) or 0)
        elif name == PER_POS:
            values = getattr(m, "values", None)
            if values is None:
                pos = int((getattr(m, "labels", None) or {}).get("position", 0))
                values = [0] * pos + [getattr(m, "value", 0) or 0]
            per_pos += [0] * (len(values) - len(per_pos))
            for i, v in enumerate(values):
                per_pos[i] += int(v)
    out["num_accepted_tokens_per_pos"] = per_pos
    return out


def counters_delta(after: dict, before: dict | None) -> dict:
    """after - before, element-wise (the counters are cumulative for the life of the engine)."""
    if not before:
        return dict(after, num_accepted_tokens_per_pos=list(after["num_accepted_tokens_per_pos"]))
    out = {key: after[key] - before.get(key, 0) for key in COUNTERS.values()}
    a, b = after["num_accepted_tokens_per_pos"], before.get("num_accepted_tokens_per_pos", [])
    out["num_accepted_tokens_per_pos"] = [x - (b[i] if i < len(b) else 0) for i, x in enumerate(a)]
    return out


def acceptance_summary(counters: dict) -> dict:
    """Counters plus acceptance_rate (accepted / drafted tokens), mean_accepted_tokens per draft,
    mean_acceptance_length (1 + accepted per draft: tokens per target step, bonus token included) and
    per_position_acceptance (accepted at position i / drafts). Undefined values (no drafts) are None."""
    drafts, drafted = counters["num_drafts"], counters["num_draft_tokens"]
    accepted = counters["num_accepted_tokens"]
    out = dict(counters)
    out["acceptance_rate"] = accepted / drafted if drafted else None
    out["mean_accepted_tokens"] = accepted / drafts if drafts else None
    out["mean_acceptance_length"] = 1 + accepted / drafts if drafts else None
    out["per_position_acceptance"] = [a / drafts for a in counters["num_accepted_tokens_per_pos"]] if drafts else []
    return out


def request_times(metrics, mono0: float, wall0: float, batch_s: float) -> dict:
    """arrival_s, admitted_s, first_token_s, finish_s in seconds from the start of the generate call.

    V1 RequestStateStats carries engine-core time.monotonic() stamps (scheduled_ts, first_token_ts,
    last_token_ts) and a wall-clock arrival_time; older RequestMetrics carry wall-clock *_time fields.
    Missing or out-of-range stamps fall back to arrival 0, admitted 0, first token NaN, finish = batch_s."""
    out = {"arrival_s": 0.0, "admitted_s": 0.0, "first_token_s": math.nan, "finish_s": batch_s}
    if metrics is None:
        return out
    if hasattr(metrics, "first_token_ts"):
        fields = {"admitted_s": ("scheduled_ts", mono0), "first_token_s": ("first_token_ts", mono0),
                  "finish_s": ("last_token_ts", mono0)}
    else:
        fields = {"admitted_s": ("first_scheduled_time", wall0), "first_token_s": ("first_token_time", wall0),
                  "finish_s": ("finished_time", wall0)}
    fields["arrival_s"] = ("arrival_time", wall0)
    for key, (attr, origin) in fields.items():
        stamp = getattr(metrics, attr, None)
        if stamp:
            rel = float(stamp) - origin
            if -0.01 <= rel <= batch_s + 0.01:
                out[key] = min(max(rel, 0.0), batch_s)
    return out


# ---------------------------------------------------------------- running

def have_vllm() -> bool:
    """True when vllm is importable (the CPU build runs without a GPU)."""
    return importlib.util.find_spec("vllm") is not None


def _tokenized_prompts(st: Study) -> list[dict]:
    from .harness import tokenized_prompts
    return tokenized_prompts(st, models.load_tokenizer(models.pair_spec(st.pair)))


def _prompts(group: list[dict]) -> list[dict]:
    return [{"prompt_token_ids": p["ids"]} for p in group]


STEP_PARTS = ("step_s", "verify_s", "draft_s", "other_s", "engine_steps")


def _generate(llm, group: list[dict], params) -> tuple[list, float, float, float, dict]:
    """One timed llm.generate call: (outputs, seconds, wall and monotonic clocks at its start, the step-time
    split of the call from vllm_steps, NaN where the engine runs in another process)."""
    timer = vllm_steps.attach(llm)
    if timer is not None:
        timer.reset()
    wall0, mono0, t = time.time(), time.monotonic(), time.perf_counter()
    outs = llm.generate(_prompts(group), params, use_tqdm=False)
    call_s = time.perf_counter() - t
    parts = timer.read() if timer is not None else dict.fromkeys(STEP_PARTS, math.nan)
    return outs, call_s, wall0, mono0, parts


def run_static(llms: dict, sampling_cls, st: Study, cell: dict, plist: list[dict]):
    """Static batches of `batch` requests through llm.generate; a warm-up batch per engine first (not recorded).

    `llms` maps an arm to its engine: "cell" (the cell's configuration) and, for paired cells, "base" (no
    speculation); paired arms alternate on every timed batch (pairing.order). Returns (request rows of the
    cell arm, batch rows with arm and pair, acceptance summary of the cell arm over the timed batches)."""
    c = Cell.from_dict(cell)
    bs = c.batch
    n_req = st.requests_per_cell(c)  # whole batches, as in the torch engine
    repeats = st.timed_repeats(c)
    chosen = [plist[i % len(plist)] for i in range(n_req)]
    params = sampling_cls(**sampling_kwargs(st, cell))
    warm = sampling_cls(**sampling_kwargs(st, cell, max_tokens=st.timing.warmup_steps))
    for llm in llms.values():
        llm.generate(_prompts(chosen[:bs]), warm, use_tqdm=False)
    before = spec_counters(llms["cell"].get_metrics())
    reqs, batches = [], []
    for bi, start in enumerate(range(0, n_req, bs)):
        group = chosen[start:start + bs]
        for rep in range(repeats):
            pair = bi * repeats + rep
            for arm in (pairing.order(pair) if len(llms) > 1 else ("cell",)):
                outs, batch_s, wall0, mono0, parts = _generate(llms[arm], group, params)
                new = [len(o.outputs[0].token_ids) for o in outs]
                rows = [{"repeat": rep, "batch_idx": bi, "rid": rid, "prompt_set": p["prompt_set"],
                         "prompt_idx": p["prompt_idx"], "prompt_tokens": len(p["ids"]), "new_tokens": n,
                         **request_times(getattr(o, "metrics", None), mono0, wall0, batch_s)}
                        for rid, (p, o, n) in enumerate(zip(group, outs, new))]
                if arm == "cell":
                    reqs += rows
                # as in the torch engine, decode_s excludes the prefill: the batch's prefill ends when its last
                # request has its first token; without per-request stamps it is unknown (NaN) and decode_s is
                # the whole call (noted in meta.json)
                first = [r["first_token_s"] for r in rows]
                prefill_s = max(first) if first and not any(math.isnan(f) for f in first) else math.nan
                batches.append({"repeat": rep, "batch_idx": bi, "arm": arm, "pair": pair, "size": len(group),
                                "prefill_s": prefill_s,
                                "decode_s": batch_s - prefill_s if not math.isnan(prefill_s) else batch_s,
                                "steps": math.nan, "new_tokens": sum(new), "decode_tokens": sum(n - 1 for n in new),
                                "call_s": batch_s, **parts,
                                "output_ids": [list(o.outputs[0].token_ids) for o in outs]})
    after = spec_counters(llms["cell"].get_metrics())
    return reqs, batches, acceptance_summary(counters_delta(after, before))


def _require_vllm() -> None:
    if not have_vllm():
        raise SpecdecError(MISSING)


def _shutdown(llm) -> None:
    """Stop an LLM's engine-core process (if any) so the next LLM gets its memory."""
    engine = getattr(llm, "llm_engine", None)
    for obj in (engine, getattr(engine, "engine_core", None)):
        if callable(getattr(obj, "shutdown", None)):
            obj.shutdown()
            return


def _free_memory() -> None:
    """Collect a stopped engine (in-process engines hold their weights until collected)."""
    gc.collect()
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def check_model_folders(kwargs: dict) -> None:
    """One-line error when a local model folder in vLLM's arguments (target, draft) has no config.json."""
    for path in [kwargs["model"], (kwargs.get("speculative_config") or {}).get("model")]:
        if path and os.path.isabs(path) and not os.path.isfile(os.path.join(path, "config.json")):
            raise SpecdecError(f"model folder {path} has no config.json; vLLM cannot load it (run `make models`)")


# vLLM 0.32 (CPU) cannot start an engine in a process where an n-gram engine has started: the next engine's start
# re-registers its CPU kernel overrides and fails ("AttributeError: '_lib_fn_wrapper' object has no attribute
# 'get'", vllm/triton_utils/dispatcher.py _rebind_kernels; seen 2026-12-05 on bs1-k2-draft after bs1-k1-ngram,
# and on a no-SD engine started after a k=5 n-gram engine).
# So a measure call with several engine configurations runs each in its own child process, which also starts
# each configuration with the memory of a fresh process.
ONE_ENGINE_PER_PROCESS = True


def engine_groups(st: Study, pending: list) -> list[list]:
    """Pending cells [(cell, folder, prepared)] grouped by the engine configuration they run on (their LLM
    arguments without max_num_seqs), groups in the order they first appear."""
    groups: dict[str, list] = {}
    for item in pending:
        kw = {k: v for k, v in llm_kwargs(st, item[0]).items() if k != "max_num_seqs"}
        groups.setdefault(engine_key(kw), []).append(item)
    return list(groups.values())


def _measure_in_children(study: str, profile: str, groups: list, counts: dict, echo) -> dict:
    """Run each engine group with `python -m specdec measure ... --only <its cell ids>` in a child process (the
    child's own output passes through); stop at the first child that fails. Counts as measure returns them."""
    import subprocess
    for i, group in enumerate(groups, 1):
        ids = [cfgmod.cell_id(cell) for cell, _, _ in group]
        echo(f"engine configuration {i}/{len(groups)} in a child process: {', '.join(ids)}")
        sys.stdout.flush()
        code = subprocess.call([sys.executable, "-m", "specdec", "measure", "--study", study, "--gpu", profile,
                                "--engine", "vllm", "--only", ",".join(ids)])
        done = sum((folder / "meta.json").exists() for _, folder, _ in group)
        counts["ran"] += done
        if code != 0:
            counts["pending"] -= counts["ran"]
            raise SpecdecError(f"the vLLM child process for {', '.join(ids)} failed (exit {code}); "
                               f"{counts['ran']} cell(s) ran, the rest resume on the next call")
    counts["pending"] -= counts["ran"]
    return counts


def engine_key(kwargs: dict) -> str:
    """One vLLM engine configuration (its LLM kwargs) as a string: equal kwargs, equal key."""
    return json.dumps(kwargs, sort_keys=True, default=str)


# The LLM arguments that decide what a target's weights are: engines equal in these load equal target weights
# (their KV space, batch size or speculation may differ).
WEIGHT_KEYS = ("model", "dtype", "quantization", "revision", "load_format", "hf_overrides")


class Engines:
    """The vLLM engines of one measure run, at most two alive: the base engine (no speculation, kept for the
    whole run under pairing) and the engine of the current configuration, keyed by engine_key of their LLM kwargs."""

    def __init__(self, llm_cls):
        self.llm_cls, self.alive, self.shared = llm_cls, {}, 0

    def get(self, kwargs: dict, cell_id: str, keep: tuple = ()):
        key = engine_key(kwargs)
        if key not in self.alive:
            for old in [k for k in self.alive if k not in keep]:
                _shutdown(self.alive.pop(old))
            _free_memory()
            self.alive[key] = self._start(kwargs, cell_id)
        return self.alive[key], key

    def paired(self, base_kwargs: dict, kwargs: dict, cell_id: str) -> tuple:
        """(base engine, SD engine, modules shared) for a paired cell. The SD engine starts last: an engine
        started later unregisters the earlier one's Prometheus collectors, so its spec-decode counters would read
        0 (bs1 k2/k4/k5/k6 draft cells, 2026-12-05), and no engine can start after an n-gram one
        (ONE_ENGINE_PER_PROCESS). Where both load the same target the same way, the base engine's target weights
        are released before the SD engine starts and then read from the SD engine's copy (vllm_share.py): one
        copy of the target in memory instead of two. Shared modules: 0 where nothing was shared."""
        base, base_key = self.get(base_kwargs, cell_id)
        same = all(kwargs.get(k) == base_kwargs.get(k) for k in WEIGHT_KEYS)
        fresh = engine_key(kwargs) not in self.alive
        hollowed = fresh and same and vllm_share.hollow(base)
        sd, _ = self.get(kwargs, cell_id, keep=(base_key,))
        if fresh:
            self.shared = vllm_share.share(base, sd) if hollowed else 0
        return base, sd, self.shared

    def _start(self, kwargs: dict, cell_id: str):
        check_model_folders(kwargs)
        try:
            return self.llm_cls(**kwargs)
        except Exception as e:  # vLLM reports a failed start as many exception types; say it in one line
            line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise SpecdecError(f"vLLM could not start the engine for {cell_id} ({kwargs['model']}): "
                               f"{type(e).__name__}: {line}") from e

    def close(self) -> None:
        for llm in self.alive.values():
            _shutdown(llm)
        self.alive.clear()


def measure(study: str, profile: str, limit: int | None = None, dry_run: bool = False, echo=print,
            only: str | None = None) -> dict:
    """Run every missing static cell of a study with vLLM under a hardware profile.

    Returns counts: cells, ran, pending (runnable, still missing), unsupported (cells vLLM cannot run)."""
    p = plan(study, profile, "vllm", limit, dry_run, echo, only, prepare=llm_kwargs, check=_require_vllm)
    if p.unsupported and len(p.unsupported) == len(p.todo):
        raise SpecdecError(f"no cell of study '{study}' can run on vLLM; {p.unsupported[0][0]}: {p.unsupported[0][1]}")
    if p.done:
        return p.counts
    st, pending, counts, machine, hw = p.st, p.pending, p.counts, p.machine, p.hw
    groups = engine_groups(st, pending)
    if ONE_ENGINE_PER_PROCESS and len(groups) > 1:  # one process per engine configuration
        return _measure_in_children(study, profile, groups, counts, echo)
    os.environ.update(engine_env(st))
    from tqdm import tqdm
    from vllm import LLM, SamplingParams

    widest = max(c["batch"] for c, _, _ in pending)
    runs = []
    for cell, folder, _ in (item for group in groups for item in group):  # cells sharing an engine run together
        kw = llm_kwargs(st, cell, resolve=True, max_num_seqs=widest)
        base = (llm_kwargs(st, {**cell, "k": 0, "proposer": "none"}, resolve=True, max_num_seqs=widest)
                if pairing.is_paired(st, Cell.from_dict(cell)) else None)
        runs.append((cell, folder, kw, base))
    plist = _tokenized_prompts(st)
    versions = rawdata.versions()
    versions.setdefault("vllm", getattr(sys.modules.get("vllm"), "__version__", "unknown"))
    rawdata.git_state()  # read now, before the first cell: the code this process imported
    engines = Engines(LLM)
    try:
        for cell, folder, kwargs, base_kwargs in tqdm(runs, desc=f"{study}/{profile}/vllm", unit="cell"):
            cid = cfgmod.cell_id(cell)
            llms, shared = {}, 0
            if base_kwargs is not None:
                llms["base"], llms["cell"], shared = engines.paired(base_kwargs, kwargs, cid)
            else:
                llms["cell"], _ = engines.get(kwargs, cid,
                                              keep=tuple(k for k in engines.alive if '"speculative_config"' not in k))
            started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            load0 = os.getloadavg()
            before = probe.read_gbs()
            reqs, batches, acceptance = run_static(llms, SamplingParams, st, cell, plist)
            if (kwargs.get("speculative_config") or {}).get("method") not in (None, "ngram") \
                    and not acceptance.get("num_drafts"):
                raise SpecdecError(f"vLLM counted no drafts for SD cell {cid}: its spec-decode counters were lost "
                                   f"(an engine started after the SD engine unregisters them); nothing is written")
            after = probe.read_gbs()
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "acceptance.json").write_text(json.dumps(acceptance, indent=2, sort_keys=True))
            meta = rawdata.run_meta(study, folder, profile, cell, p.cfg, machine, "vllm",
                                    hardware.device_for(hw), started, load0, versions,
                                    acceptance=acceptance, timing_notes=TIMING_NOTES,
                                    probe={"before": before, "after": after}, **models.weights_of(st.pair),
                                    vllm={"llm_kwargs": kwargs, "base_llm_kwargs": base_kwargs,
                                          "env": engine_env(st), "sampling_kwargs": sampling_kwargs(st, cell),
                                          "shared_target_modules": shared})
            rawdata.write_run(folder, {"requests": pd.DataFrame(reqs), "batches": pd.DataFrame(batches)}, meta)
            counts["ran"] += 1
    finally:
        engines.close()
    counts["pending"] -= counts["ran"]
    return counts
