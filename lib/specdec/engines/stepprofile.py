"""Where one no-SD decode step of a target model spends its seconds, by operator family (torch.profiler, CPU).

A diagnosis for the torch engine's batched decoding (issue 17 item 7), not a study: one forward of `batch`
sequences, 1 new token each, over a `context`-token cache built by one prefill and repeated along the batch.
The cache is transformers' DynamicCache, the class the engine's KVState wraps: each step appends the new
token's K and V with torch.cat, copying every layer's whole cache (bytes per step ~ batch * context). The
engine's masks with holes are not reproduced (all slots valid: transformers drops the all-ones mask, and its
sdpa path then reads the KV heads in place), so attention here takes a faster path than the engine's;
profile_engine runs the engine's own decode steps on the same shapes, to tell the two apart (with an explicit
mask transformers copies K and V out to every query head: its copy shows as "other"), and gqa_attention times
that copy against torch's sdpa with enable_gqa (the engine's `torch: {attention: gqa}`, attention.py).

    python -m specdec.engines.stepprofile --pair qwen2.5-coder-1.5b/0.5b --batch 16 32 64 --context 256 \
        --out build/cpu/stepprofile.csv

`--kv concat grow` times no-SD engine decode steps with the cache growing either way (kv_paths, interleaved).
`--verify K` instead times greedy n-gram SD over one static batch of the acceptance study's prompts with the
target's verify padded to K+1 tokens against 1 + the batch's longest proposal (verify_widths).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

# operator-name fragments per family; anything else is "other"
FAMILIES = {"linear": ("linear", "addmm", "aten::mm", "matmul"), "kv append (cat)": ("aten::cat",),
            "attention": ("scaled_dot_product", "bmm", "softmax")}


def family(name: str) -> str:
    """The family of a profiler operator name."""
    for fam, parts in FAMILIES.items():
        if any(p in name for p in parts):
            return fam
    return "other"


def profile_step(model, batch: int, context: int, repeats: int = 3) -> pd.DataFrame:
    """Per family: self CPU seconds of one decode step (median over `repeats` profiled steps), its share of
    the step's self CPU time, and the step's wall seconds (unprofiled, median). Columns: batch, context,
    family, seconds [s], share, step_s [s]."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    from .kv import _cache_arg

    gen = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    prompt = torch.randint(0, vocab, (1, context), generator=gen)
    x = torch.randint(0, vocab, (batch, 1), generator=gen)
    mask = torch.ones(batch, context + 1, dtype=torch.long)
    rows, walls = [], []
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        arg = _cache_arg(model)  # the cache keyword of this transformers version
        model(prompt, **{arg: cache}, use_cache=True)
        cache.batch_repeat_interleave(batch)

        def step():
            model(x, attention_mask=mask, **{arg: cache}, use_cache=True, logits_to_keep=1)
            cache.crop(-1)  # drop the appended token again: every step sees `context` tokens

        step()  # warm-up
        for _ in range(repeats):
            t = time.perf_counter()
            step()
            walls.append(time.perf_counter() - t)
            with profile(activities=[ProfilerActivity.CPU]) as p:
                step()
            rows += [{"family": f, "seconds": s} for f, s in _families(p).items()]
    return _frame(pd.DataFrame(rows).groupby("family", as_index=False)["seconds"].median(), batch, context, walls)


def _families(prof) -> dict:
    """Self CPU seconds per family of one profile."""
    fam = {}
    for ev in prof.key_averages():
        fam[family(ev.key)] = fam.get(family(ev.key), 0.0) + ev.self_cpu_time_total / 1e6
    return fam


def _frame(df: pd.DataFrame, batch: int, context: int, walls: list) -> pd.DataFrame:
    """The profile table: family seconds per step, their shares, and the median wall seconds of a step."""
    df = df.assign(share=df["seconds"] / df["seconds"].sum())
    return df.assign(batch=batch, context=context, step_s=float(pd.Series(walls).median()))[
        ["batch", "context", "family", "seconds", "share", "step_s"]]


def _prefilled(model, batch: int, context: int, new_tokens: int):
    """A no-SD engine after the prefill of `batch` random prompts of `context` tokens (seed 0: the same prompts
    every call), `new_tokens` to decode each."""
    import torch

    from .engine import GenConfig, prefill

    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, int(model.config.vocab_size), (batch, context), generator=gen).tolist()
    return prefill(model, None, prompts, GenConfig(k=0, proposer="none", max_new_tokens=new_tokens,
                                                   ignore_eos=True))[0]


def _walls(steps) -> list:
    """Wall seconds of each engine step record."""
    return [st["draft_s"] + st["verify_s"] + st["other_s"] for st in steps]


def profile_engine(model, batch: int, context: int, new_tokens: int = 6) -> pd.DataFrame:
    """The same split for the torch engine's own no-SD decode steps (engine.decode after engine.prefill, k=0):
    `batch` random prompts of `context` tokens (no padding), `new_tokens` each; seconds per decode step are the
    profiled decode's family seconds / its steps; step_s is the engine's own step timing, taken while profiled
    (the profiler adds its overhead). Same columns as profile_step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .engine import decode

    with torch.no_grad():
        eng = _prefilled(model, batch, context, new_tokens)
        with profile(activities=[ProfilerActivity.CPU]) as p:
            decode(eng)
    steps = max(len(eng.steps), 1)
    walls = _walls(eng.steps) or [float("nan")]
    return _frame(pd.DataFrame([{"family": f, "seconds": s / steps} for f, s in _families(p).items()]),
                  batch, context, walls)


def kv_paths(model, batch: int, context: int, paths=("concat", "grow"), pairs: int = 3,
             new_tokens: int = 16) -> pd.DataFrame:
    """Wall seconds per no-SD engine decode step under each torch.kv path (kv.py), interleaved A B, B A, ...
    for `pairs` pairs, unprofiled: `batch` random prompts of `context` tokens, `new_tokens` each (the first
    step after the prefill, where a grown cache first copies the prefill's K/V into its buffer, is left out).
    Columns: pair, kv, batch, context, step_s [s] (median step of the pair's decode), and ratio (the pair's
    step_s / its first path's step_s). The model's kv path is set back to the first path afterwards."""
    import numpy as np
    import torch

    from . import kv as kvmod
    from .engine import decode

    rows = []
    with torch.no_grad():
        for i in range(-1, pairs):  # pair -1: warm-up, not kept
            order = list(paths) if i % 2 == 0 else list(reversed(paths))
            for path in order:
                kvmod.apply(model, path)
                eng = _prefilled(model, batch, context, new_tokens)
                decode(eng)
                walls = _walls(eng.steps[1:])
                if i >= 0:
                    rows.append({"pair": i, "kv": path, "batch": batch, "context": context,
                                 "step_s": float(np.median(walls))})
    kvmod.apply(model, paths[0])
    out = pd.DataFrame(rows)
    first = out[out["kv"] == paths[0]].set_index("pair")["step_s"]
    return out.assign(ratio=out["step_s"] / out["pair"].map(first))


def gqa_attention(batch: int, heads: int, kv_heads: int, context: int, head_dim: int, layers: int,
                  repeats: int = 3) -> dict:
    """One decode step's attention over all `layers`, two ways, with an explicit boolean mask (as the engine
    passes): K and V repeated out to every query head first (what transformers' sdpa path does whenever a mask
    is given: repeat_kv) and torch's sdpa with enable_gqa (the KV heads read in place). Returns the median
    seconds per step of each ("repeat_kv_s", "enable_gqa_s") and whether their outputs agree ("same")."""
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import repeat_kv

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, 1, head_dim, generator=gen)
    k, v = (torch.randn(batch, kv_heads, context, head_dim, generator=gen) for _ in range(2))
    mask = torch.ones(batch, 1, 1, context, dtype=torch.bool)
    mask[:, :, :, : context // 8] = False  # holes, as rejected or padded slots
    groups = heads // kv_heads
    ways = {"repeat_kv_s": lambda: F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups),
                                                                  attn_mask=mask),
            "enable_gqa_s": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)}
    out = {"same": bool(torch.allclose(ways["repeat_kv_s"](), ways["enable_gqa_s"](), atol=1e-5))}
    times = {name: [] for name in ways}
    for _ in range(repeats):
        for name, f in ways.items():  # interleaved
            t = time.perf_counter()
            for _ in range(layers):
                f()
            times[name].append(time.perf_counter() - t)
    return out | {name: float(pd.Series(t).median()) for name, t in times.items()}


def verify_widths(target, tok, plist: list[list[int]], k: int, new_tokens: int, pairs: int = 2,
                  match: str = "earliest", arms: tuple = ("k", "proposed")) -> pd.DataFrame:
    """Greedy n-gram SD with the torch engine over one static batch of prompts (token ids), two torch.verify
    settings (`arms`: "k" pads every verify to k+1 tokens, "proposed" verifies 1 + the batch's longest proposal,
    "ragged" that width with only the real tokens multiplied), interleaved A B, B A, ... for `pairs` pairs. One
    row per run: pair, verify, decode_s [s], tokens, tok_s [tokens/s], steps, columns (mean token columns per
    verify forward), rows (mean tokens per sequence the Linears multiply per verify), same (greedy tokens equal
    to the first arm's run of the same pair). A diagnosis, not a study: no raw folder, no CI."""
    from . import pairing
    from .engine import GenConfig, generate

    pad = getattr(tok, "pad_token_id", 0) or 0
    rows = []
    for i in range(pairs):
        for width in pairing.order(i, tuple(arms)):
            cfg = GenConfig(k=k, proposer="ngram", max_new_tokens=new_tokens, ignore_eos=True, ngram_match=match,
                            verify=width)
            eng, _, dec = generate(target, None, plist, cfg, pad_token_id=pad)
            out = [s.generated for s in eng.requests]
            widths = [1 + (k if width == "k" else max(st["proposed"])) for st in eng.steps]
            mult = [(sum(1 + p for p in st["proposed"]) / len(st["proposed"])) if width == "ragged" else w
                    for st, w in zip(eng.steps, widths)]
            tokens = sum(len(g) for g in out)
            rows.append({"pair": i, "verify": width, "decode_s": dec, "tokens": tokens, "tok_s": tokens / dec,
                         "steps": len(eng.steps), "columns": sum(widths) / max(len(widths), 1),
                         "rows": sum(mult) / max(len(mult), 1), "out": out})
        a, b = rows[-2:]
        for r in (a, b):
            r["same"] = a["out"] == b["out"]
    return pd.DataFrame(rows).drop(columns="out")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="qwen2.5-coder-1.5b/0.5b")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--context", type=int, default=256, help="KV tokens per sequence")
    ap.add_argument("--linear", default="onednn", help="dense or onednn (the cpu batch study's path)")
    ap.add_argument("--attention", default="sdpa", help="sdpa or gqa (engines/attention.py)")
    ap.add_argument("--what", nargs="+", default=["bare forward", "engine decode"],
                    help="'bare forward' (profile_step) and/or 'engine decode' (profile_engine)")
    ap.add_argument("--gqa", type=int, nargs=4, metavar=("HEADS", "KV_HEADS", "HEAD_DIM", "LAYERS"),
                    help="only time attention with a mask, repeat_kv vs enable_gqa (gqa_attention), for this shape "
                         "(Qwen2.5-1.5B: 12 2 128 28)")
    ap.add_argument("--verify", type=int, metavar="K", default=None,
                    help="only time greedy n-gram SD at this k, two verify settings (--arms; verify_widths), on "
                         "the first --batch prompts of --study's cpu prompts")
    ap.add_argument("--arms", nargs=2, default=["k", "proposed"], metavar=("A", "B"),
                    help="the two torch.verify settings --verify interleaves (k, proposed, ragged)")
    ap.add_argument("--kv", nargs="+", default=None, metavar="PATH",
                    help="only time no-SD engine decode steps under these torch.kv paths (concat, grow; kv_paths), "
                         "interleaved --pairs times, at each --batch and --context")
    ap.add_argument("--study", default="acceptance", help="whose prompts and new tokens --verify uses")
    ap.add_argument("--pairs", type=int, default=2, help="interleaved pairs for --verify")
    ap.add_argument("--out", default=None, help="CSV to write (default: print only)")
    a = ap.parse_args(argv)
    import torch

    from ..data import models
    from . import attention, onednn

    if a.gqa:
        heads, kv_heads, head_dim, layers = a.gqa
        for b in a.batch:
            print(f"bs {b}:", gqa_attention(b, heads, kv_heads, a.context, head_dim, layers))
        return

    pair = models.load_pair(a.pair, dtype=torch.float32, with_draft=False)
    model = pair.target.eval()
    onednn.apply(model, a.linear)
    attention.apply(model, a.attention)
    if a.kv:
        out = pd.concat([kv_paths(model, b, a.context, tuple(a.kv), a.pairs) for b in a.batch], ignore_index=True)
    elif a.verify is not None:
        from ..data import config
        from ..data.spec import Study
        from .harness import tokenized_prompts

        st = Study.from_dict(config.load_study(a.study, "cpu"))
        plist = [p["ids"] for p in tokenized_prompts(st, pair.tokenizer)][: a.batch[0]]
        with torch.no_grad():
            out = verify_widths(model, pair.tokenizer, plist, a.verify, st.generation.max_new_tokens, a.pairs,
                                st.generation.ngram_match, tuple(a.arms))
    else:
        out = pd.concat([f(model, b, a.context).assign(what=what) for b in a.batch
                         for what, f in (("bare forward", profile_step), ("engine decode", profile_engine))
                         if what in a.what], ignore_index=True)
    print(out.to_string(index=False))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        out.to_csv(a.out, index=False)


if __name__ == "__main__":
    main()
