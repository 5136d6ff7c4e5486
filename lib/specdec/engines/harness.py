"""Run a study grid on this machine with the torch engine; one raw folder per cell; resumable."""
from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from ..data import config as cfgmod
from ..data import hardware, models, prompts, rawdata, traces
from ..data.spec import PROPOSERS, Cell, Study
from ..errors import SpecdecError
from . import attention as attn
from . import kv as kvmod
from . import pairing, probe
from .engine import GenConfig, Sequence, SpecEngine, decode, generate, prefill
from .plan import plan
from .timing import clock


def quantize(model, quant: str):
    """Weight quantization: int8 = torch dynamic int8 Linear (CPU; the model is made fp32 first),
    bf16 = bfloat16 weights and activations."""
    if quant in (None, "none"):
        return model
    if quant == "int8":
        import warnings

        from torch.ao.quantization import quantize_dynamic
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return quantize_dynamic(model.float(), {torch.nn.Linear}, dtype=torch.qint8)
    if quant == "bf16":
        return model.to(torch.bfloat16)
    raise ValueError(f"unknown quant '{quant}'")


class ModelCache:
    """Loads the pair once and keeps quantized variants keyed by the cell's quant.

    quant "none" is the config's own regime: target in `dtype`, draft in `draft_dtype` quantized by
    `draft_quant` (e.g. a bf16 target with an int8 draft); another quant applies to both models.
    linear "onednn" packs the regime's fp32 Linear layers for oneDNN (onednn.py; an int8 draft keeps its own);
    attention "gqa" lets torch's sdpa read the KV heads in place (attention.py); kv "grow" writes each step's K/V
    into spare cache capacity instead of concatenating (kv.py)."""

    def __init__(self, pair_name: str, dtype: str, device: str, draft_dtype: str | None = None,
                 draft_quant: str = "none", linear: str = "dense", attention: str = "sdpa", kv: str = "concat"):
        self.pair = models.load_pair(pair_name, dtype=getattr(torch, dtype), device=device,
                                     draft_dtype=getattr(torch, draft_dtype or dtype))
        self.linear = linear
        target, draft = self.pair.target, quantize(self.pair.draft, draft_quant)
        if linear != "dense":
            from . import onednn
            # a quantized draft's Linears are not nn.Linear: it keeps its own kernels
            for model in (target, draft if draft_quant in (None, "none") else None):
                why = None if model is None else onednn.usable(model)
                if why:
                    raise SpecdecError(f"torch.linear: {linear}: {why}")
                onednn.apply(model, linear)
        for model in (target, draft):
            attn.apply(model, attention)
            kvmod.apply(model, kv)
        self.variants = {"none": (target, draft)}
        self.attention, self.kv = attention, kv
        self.dtype, self.device, self._eagle, self._offload = dtype, device, None, None

    def eagle(self):
        """The pair's EAGLE-sized head (loaded at first use), in the target's dtype; a one-line error if none."""
        if self._eagle is None:
            src = self.pair.spec.eagle
            if src is None:
                raise SpecdecError(f"pair '{self.pair.spec.name}' has no EAGLE-sized head (proposer eagle)")
            self._eagle = kvmod.apply(attn.apply(models.load_model(src, getattr(torch, self.dtype), self.device),
                                                 self.attention), self.kv)
        return self._eagle

    def offloaded(self):
        """A context in which the target streams its decoder layers from host memory (offload.py)."""
        if self._offload is None:
            from .offload import LayerOffload
            self._offload = LayerOffload(self.pair.target)
        return self._offload.active()

    def get(self, quant: str):
        if quant not in self.variants and self.linear != "dense":
            raise SpecdecError(f"quant cells ('{quant}') run on the dense Linear path; this config sets "
                               f"torch.linear: {self.linear}")
        if quant not in self.variants:
            import copy
            self.variants[quant] = (quantize(copy.deepcopy(self.pair.target), quant),
                                    quantize(copy.deepcopy(self.pair.draft), quant))
        return self.variants[quant]


def gen_config(st: Study, cell: dict, seed: int | None = None) -> GenConfig:
    """The engine settings of a cell (seed: the study's seed unless given)."""
    return GenConfig.from_cell(st.generation, Cell.from_dict(cell), st.seed if seed is None else seed,
                               st.torch.verify, st.torch.finished)


# whose traced acceptance a cell replays
TRACE_PROPOSER = {n: p.traced_as for n, p in PROPOSERS.items() if p.traced_as}


def _trace_source(st: Study, dataset: str | None = None) -> tuple[str, str]:
    """(collection, dataset) a trace-replayed study reads: generation.acceptance_trace, its dataset replaced by
    a cell's `trace` where given."""
    name, _, own = st.generation.acceptance_trace.partition("/")
    return name, dataset or own


def trace_prompts(st: Study, vocab_size: int, dataset: str | None = None) -> list[dict]:
    """Prompts of a trace-replayed study (generation.acceptance_trace, or its collection's `dataset`): one per
    traced request that has both proposers' traces, random token ids (seeded) of its prompt length (capped at
    prompts.max_prompt_tokens), with its acc_len per proposer under "acc"."""
    name, dataset = _trace_source(st, dataset)
    per = {p: {r.id: r for r in traces.load(name, dataset, p).requests} for p in traces.PROPOSERS}
    ids = [i for i in per["eagle"] if i in per["ngram"]]
    if not ids:
        raise SpecdecError(f"{name}/{dataset}: no request has both eagle and n-gram traces")
    rng = np.random.default_rng(st.seed)
    out = []
    for idx, rid in enumerate(ids):
        n = max(1, min(per["eagle"][rid].prompt_len, st.prompts.max_prompt_tokens))
        out.append({"prompt_set": dataset, "prompt_idx": idx, "trace_id": rid,
                    "ids": rng.integers(3, vocab_size, size=n).tolist(),
                    "acc": {p: per[p][rid].acc_len for p in traces.PROPOSERS}})
    return out


def _replayed(st: Study, cell: dict) -> dict:
    """meta.json's `acceptance_trace` (COLLECTION/DATASET) for a cell that replays one, else nothing."""
    if not st.generation.acceptance_trace or cell["mode"] in cfgmod.FORWARD_MODES:
        return {}
    return {"acceptance_trace": "/".join(_trace_source(st, cell.get("trace")))}


def tokenized_prompts(st: Study, tokenizer) -> list[dict]:
    """The study's prompts as token ids (the last prompts.max_prompt_tokens of each), or a trace-replayed
    study's trace_prompts."""
    if st.generation.acceptance_trace:
        return trace_prompts(st, tokenizer.vocab_size)
    spec = st.prompts
    items = prompts.build(list(spec.sets), spec.per_set)
    limit = spec.max_prompt_tokens
    out = []
    for name, idx, text in items:
        ids = tokenizer.encode(text)[-limit:]
        out.append({"prompt_set": name, "prompt_idx": idx, "ids": ids})
    return out


def _request_rows(seqs, meta_by_rid, repeat, batch_idx):
    return [{"repeat": repeat, "batch_idx": batch_idx, "rid": s.rid, **meta_by_rid[s.rid],
             "new_tokens": len(s.generated), "arrival_s": s.arrival_s, "admitted_s": s.admitted_s,
             "first_token_s": s.first_token_s, "finish_s": s.finish_s} for s in seqs]


def _step_rows(steps, repeat, batch_idx):
    return [dict(r, repeat=repeat, batch_idx=batch_idx) for r in steps]


def run_static(st: Study, cell, target, draft, plist, tok):
    """Static batching: requests in fixed batches of `batch`. Each batch is prefilled once; a warm-up decode
    and then every timed repeat start from copies of that prefilled state (same work, fresh seed).

    Paired cells (pairing.py) prefill each batch once more without speculation and run the two arms back to
    back on every timed repeat, alternating which goes first; batch rows carry `arm` and `pair`."""
    c = Cell.from_dict(cell)
    gens = {"cell": gen_config(st, cell)}
    if pairing.is_paired(st, c):
        gens["base"] = gen_config(st, {**cell, "k": 0, "proposer": "none", "alpha": None})
    bs = c.batch
    n_req = st.requests_per_cell(c)  # whole batches
    chosen = [plist[i % len(plist)] for i in range(n_req)]
    pad = getattr(tok, "pad_token_id", 0) or 0
    # timed decodes per batch: `repeats`, raised so the cell has >= timing.min_timed_batches in all
    repeats = st.timed_repeats(c)
    reqs, steps, batches = [], [], []
    for bi, start in enumerate(range(0, n_req, bs)):
        group = chosen[start:start + bs]
        if st.generation.acceptance_trace and c.k > 0 and c.proposer in TRACE_PROPOSER:
            # sequence i of this batch replays the acceptance of the batch's i-th traced request
            gens["cell"] = replace(gens["cell"], replay=tuple(
                tuple(p["acc"][TRACE_PROPOSER[c.proposer]]) for p in group)).validate()
        prefilled = {arm: prefill(target, draft if g.k else None, [p["ids"] for p in group], g,
                                  tok.eos_token_id, pad) for arm, g in gens.items()}
        if bi == 0:
            for base, _ in prefilled.values():
                decode(base.clone(), max_steps=st.timing.warmup_steps)
        info = {i: {"prompt_set": p["prompt_set"], "prompt_idx": p["prompt_idx"],
                    "prompt_tokens": len(p["ids"])} for i, p in enumerate(group)}
        for rep in range(repeats):
            pair = bi * repeats + rep
            for arm in (pairing.order(pair) if len(gens) > 1 else ("cell",)):
                base, prefill_s = prefilled[arm]
                eng = base.clone(seed=gens[arm].seed + 1000 * rep + bi)
                cpu0 = time.process_time()
                decode_s = decode(eng)
                cpu_s = time.process_time() - cpu0
                if arm == "cell":  # requests and steps describe the cell's own configuration
                    reqs += _request_rows(eng.requests, info, rep, bi)
                    steps += _step_rows(eng.steps, rep, bi)
                batches.append({"repeat": rep, "batch_idx": bi, "arm": arm, "pair": pair, "size": len(group),
                                "prefill_s": prefill_s, "decode_s": decode_s, "steps": len(eng.steps),
                                "new_tokens": sum(len(s.generated) for s in eng.requests),
                                "decode_tokens": sum(len(s.generated) - 1 for s in eng.requests),
                                # process CPU seconds over wall seconds: ~torch threads when nothing competes
                                "cpu_util": cpu_s / decode_s})
    return reqs, steps, batches


def run_poisson(st: Study, cell, target, draft, plist, tok):
    """Continuous batching with Poisson arrivals (rate per second), at most `batch` sequences at once."""
    if st.generation.acceptance_trace:
        raise SpecdecError("generation.acceptance_trace replays static cells only, not poisson ones")
    gen = gen_config(st, cell)
    n_req = st.prompts.requests
    rng = np.random.default_rng(st.seed)
    arrivals = np.cumsum(rng.exponential(1.0 / cell["rate"], size=n_req))
    pad = getattr(tok, "pad_token_id", 0) or 0
    generate(target, draft, [plist[0]["ids"]], replace(gen, max_new_tokens=4),
             tok.eos_token_id, pad)
    reqs, steps = [], []
    for rep in range(st.timing.repeats):
        eng = SpecEngine(target, draft, replace(gen, seed=gen.seed + rep),
                         tok.eos_token_id, pad)
        queue = [Sequence(i, plist[i % len(plist)]["ids"], gen.max_new_tokens, arrival_s=float(arrivals[i]))
                 for i in range(n_req)]
        info = {i: {"prompt_set": plist[i % len(plist)]["prompt_set"], "prompt_idx": plist[i % len(plist)]["prompt_idx"],
                    "prompt_tokens": len(plist[i % len(plist)]["ids"])} for i in range(n_req)}
        finished = []
        while queue or eng.seqs:
            now = eng.now()
            room = cell["batch"] - len(eng.seqs)
            ready = [s for s in queue if s.arrival_s <= now][:max(room, 0)]
            if ready:
                queue = queue[len(ready):]
                eng.add(ready)
            if not eng.seqs:
                time.sleep(max(0.0, queue[0].arrival_s - eng.now()))
                continue
            eng.step()
            finished += eng.retire()
        reqs += _request_rows(finished, info, rep, 0)
        steps += _step_rows(eng.steps, rep, 0)
    return reqs, steps, []


def fill_cache(kv, ctx: int, gen) -> None:
    """Give every sequence `ctx` cached tokens of random keys/values: the cost of attending to a context
    does not depend on its content, and this skips a prefill that costs minutes on a CPU. The values are drawn
    where `gen` lives (on a GPU: gigabytes of cache for 8B at batch 128, which a CPU would take minutes to draw)."""
    from .kv import _layers

    for layer in _layers(kv.cache):
        shape = (*layer.keys.shape[:2], ctx, layer.keys.shape[3])
        layer.keys = torch.randn(shape, generator=gen, device=gen.device).to(layer.keys)
        layer.values = torch.randn(shape, generator=gen, device=gen.device).to(layer.values)
    kv.mask = torch.ones(kv.batch, ctx, dtype=torch.bool, device=kv.mask.device)


def run_forward(st: Study, cell, target, draft, plist, tok, names=("target", "draft")):
    """Timed forward passes: `batch` sequences with `context` cached tokens each append k+1 tokens.

    One row per (model, repeat): seconds for that single forward, synchronized, after warm-up; `names` label
    target and draft (an offload cell passes no draft and labels its target "target-offload")."""
    from .kv import KVState

    device = next(target.parameters()).device
    bs, ctx, q = cell["batch"], cell["context"], cell["k"] + 1
    gen = torch.Generator().manual_seed(st.seed)
    fill = gen if device.type == "cpu" else torch.Generator(device=device).manual_seed(st.seed)
    vocab = min(target.config.vocab_size, draft.config.vocab_size if draft is not None else 10**9)
    rows = []
    for name, model in zip(names, (target, draft)):
        if model is None:
            continue
        kv = KVState(model)
        kv.forward(torch.randint(0, vocab, (bs, 1), generator=gen).to(device),
                   torch.ones(bs, 1, dtype=torch.bool, device=device), last_only=True)
        fill_cache(kv, ctx, fill)
        toks = torch.randint(0, vocab, (bs, q), generator=gen).to(device)
        valid = torch.ones(bs, q, dtype=torch.bool, device=device)
        warm, reps = st.timing.warmup_forwards, st.timing.repeats
        for rep in range(-warm, reps):
            t = clock(device)
            kv.forward(toks, valid)
            dt = clock(device) - t
            kv.invalidate(kv.slots - q, torch.zeros(bs, dtype=torch.long, device=device), q)
            kv.compact()
            if rep >= 0:
                rows.append({"model": name, "repeat": rep, "batch": bs, "query": q, "context": ctx,
                             "tokens": bs * q, "seconds": dt})
    return rows


ASSISTANT_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def hf_generate(target, assistant, group: list[list[int]], k: int, max_new: int, pad: int) -> list[list[int]]:
    """transformers' greedy `generate` on left-padded prompts, with `assistant` (assisted generation, exactly
    k draft tokens per round) or without (assistant None). Returns the new tokens per sequence.

    The assistant reads its settings from its own generation_config, not from generate's kwargs (the
    candidate generator copies assistant_model.generation_config), so they are set there for the call and
    restored after it: k tokens, a constant schedule, no confidence-based early stop."""
    device = next(target.parameters()).device
    width = max(len(p) for p in group)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=device)
    extra, saved = {}, {}
    if assistant is not None:
        gc = assistant.generation_config
        saved = {a: getattr(gc, a, None) for a in ASSISTANT_SETTINGS}
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = \
            k, "constant", 0.0
        extra = {"assistant_model": assistant}
    try:
        out = target.generate(ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                              do_sample=False, pad_token_id=pad, **extra)
    finally:
        for a, v in saved.items():
            setattr(assistant.generation_config, a, v)
    return out[:, width:].tolist()


def run_hf(st: Study, cell, target, draft, plist, tok):
    """Our engine vs HF `generate` (k=0) or HF assisted generation (k>0, batch 1), same prompts and k.

    One row per (impl, repeat, batch_idx): seconds for the whole generate call (prefill included),
    and whether the greedy outputs agree token for token. The two run back to back on each batch, the
    order alternating from batch to batch so neither always runs first."""

    c = Cell.from_dict(cell)
    gen = gen_config(st, cell)
    bs, k = c.batch, c.k
    pad = getattr(tok, "pad_token_id", 0) or 0
    n_req = st.requests_per_cell(c)
    chosen = [plist[i % len(plist)]["ids"] for i in range(n_req)]
    device = next(target.parameters()).device

    def ours(group):
        eng, _, _ = generate(target, draft, group, gen, tok.eos_token_id, pad)
        return [s.generated for s in eng.requests]

    def hf(group):
        return hf_generate(target, draft if k > 0 else None, group, k, gen.max_new_tokens, pad)

    for fn in (ours, hf):  # warm-up
        fn(chosen[:bs])
    rows = []
    for rep in range(st.timing.repeats):
        for bi, start in enumerate(range(0, n_req, bs)):
            group = chosen[start:start + bs]
            outs = {}
            pair = (("ours", ours), ("hf", hf))
            for name, fn in (pair if (rep + bi) % 2 == 0 else pair[::-1]):  # alternate who goes first
                t = clock(device)
                outs[name] = fn(group)
                rows.append({"impl": name, "repeat": rep, "batch_idx": bi, "size": len(group),
                             "seconds": clock(device) - t,
                             "new_tokens": sum(len(o) for o in outs[name])})
            same = [a == b[: len(a)] for a, b in zip(outs["ours"], outs["hf"])]
            rows[-1]["same_output"] = rows[-2]["same_output"] = float(sum(same)) / len(same)
    return rows


def measure(study: str, profile: str, limit: int | None = None, dry_run: bool = False, echo=print,
            only: str | None = None, budget_s: float | None = None, staged: bool = False) -> dict:
    """Run every missing cell of a study under a hardware profile. Returns counts of done/skipped cells.
    budget_s: start no cell once this many seconds have passed since the call (each cell started finishes).
    staged: measure the config's staged torch settings (torch_next; plan)."""
    t_start = time.monotonic()
    p = plan(study, profile, "torch", limit, dry_run, echo, only, staged=staged)
    if p.done:
        return p.counts
    hw, machine, cfg, st, pending = p.hw, p.machine, p.cfg, p.st, p.pending
    if st.threads:
        torch.set_num_threads(int(st.threads))
    if any(c.get("proposer") == "eagle" for c, _, _ in pending) and models.pair_spec(st.pair).eagle is None:
        raise SpecdecError(f"pair '{st.pair}' has no EAGLE-sized head: its torch engine cannot run proposer eagle")
    device = hardware.device_for(hw)
    mc = ModelCache(st.pair, st.dtype or "float32", device, st.draft_dtype, st.draft_quant, st.torch.linear,
                    st.torch.attention, st.torch.kv)
    tok = mc.pair.tokenizer
    plists = {}
    on_cpu = str(device) == "cpu"  # the probe reads host memory: it says nothing of a GPU's timings
    ran = 0
    for cell, folder, _ in tqdm(pending, desc=f"{study}/{profile}", unit="cell"):
        if budget_s is not None and time.monotonic() - t_start > budget_s:
            echo(f"time budget of {budget_s:g} s spent: {len(pending) - ran} cell(s) left for a later run")
            break
        target, draft = mc.get(cell.get("quant", "none"))
        if cell.get("proposer") == "eagle" and cell["k"] > 0:
            draft = mc.eagle()
        trace = cell.get("trace")
        if trace not in plists and cell["mode"] not in cfgmod.FORWARD_MODES:  # forward cells need no prompts
            plists[trace] = (trace_prompts(st, tok.vocab_size, trace) if trace else tokenized_prompts(st, tok))
        plist = plists.get(trace)
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        load0 = os.getloadavg()
        before = probe.read_gbs() if on_cpu else None
        if cell["mode"] == "forward":
            tables = {"forwards": pd.DataFrame(run_forward(st, cell, target, draft, plist, tok))}
        elif cell["mode"] == "offload":
            with mc.offloaded() as streamed:
                rows = run_forward(st, cell, streamed, None, plist, tok, names=("target-offload",))
            tables = {"forwards": pd.DataFrame(rows)}
        elif cell["mode"] == "hf":
            tables = {"bench": pd.DataFrame(run_hf(st, cell, target, draft, plist, tok))}
        else:
            runner = run_poisson if cell["mode"] == "poisson" else run_static
            reqs, steps, batches = runner(st, cell, target, draft, plist, tok)
            tables = {"requests": pd.DataFrame(reqs), "steps": pd.DataFrame(steps),
                      "batches": pd.DataFrame(batches)}
        after = probe.read_gbs() if on_cpu else None
        rawdata.write_run(folder, tables, rawdata.run_meta(study, folder, profile, cell, cfg, machine,
                                                           "torch", str(device), started, load0,
                                                           **({"probe": {"before": before, "after": after}}
                                                              if on_cpu else {}),
                                                           **_replayed(st, cell),
                                                           **models.weights_of(st.pair, cell.get("proposer"))))
        ran += 1
    return {**p.counts, "ran": ran, "pending": p.counts["pending"] - ran}
