"""One copy of the target's weights for a paired vLLM cell: the no-SD (base) engine computes with the SD engine's
target weights.

A paired cell keeps two in-process vLLM engines alive, each with its own copy of the target (fp32 1.5B: 7.1 GB
with vLLM's packed copy of the embedding). On a 24 GB machine the draft-model engine does not fit beside a full
base engine at batch 16. Both engines load the same model folder with the same dtype, so their target weights are
equal; this module lets the base engine read the SD engine's copy:
  * `hollow(base)` before the SD engine starts: every layer of the base model that multiplies through vLLM's CPU
    GEMM dispatch (`cpu_linear`, a closure over a oneDNN handle owning the packed weight) gets a stub that
    raises, and its parameters become empty tensors, so their memory is released before the second engine loads;
  * `share(base, sd)` after: each hollowed layer takes the SD target's layer's `cpu_linear` and parameters, by
    module name (shapes checked).
Only the target model's weights are shared: each engine keeps its own KV cache, scheduler, sampler and buffers
(rotary tables), and runs its own forwards, so the base engine still is vLLM's no-SD engine, reading the same
bytes the SD engine's target reads. Works where the engine runs in this process (vllm_steps.model_runner);
elsewhere both functions return 0 and nothing changes. Written against vLLM 0.32 (layers/utils.py
dispatch_cpu_unquantized_gemm).
"""
from __future__ import annotations

from ..errors import SpecdecError
from .vllm_steps import model_runner

HOLLOW = "_specdec_hollow"


def _model(llm):
    runner = model_runner(llm)
    return getattr(runner, "model", None) if runner is not None else None


def _stub(*args, **kwargs):
    raise RuntimeError("this vLLM engine's weights were released for sharing and not yet re-pointed")


def hollow(base) -> int:
    """Release the base engine's target weights (cpu_linear closures and parameters); returns the number of
    modules hollowed (0 where the engine is not in this process)."""
    import torch
    model = _model(base)
    if model is None:
        return 0
    n = 0
    for _, mod in model.named_modules():
        params = list(mod.named_parameters(recurse=False))
        if not hasattr(mod, "cpu_linear") and not params:
            continue
        if hasattr(mod, "cpu_linear"):
            mod.cpu_linear = _stub
        setattr(mod, HOLLOW, {pname: tuple(p.shape) for pname, p in params})
        for _, p in params:
            p.data = torch.empty(0, dtype=p.dtype)
        n += 1
    return n


def share(base, sd) -> int:
    """Point every hollowed module of the base engine's model at the same-named module of the SD engine's target
    model (its cpu_linear and parameters); returns the number of modules shared. One-line SpecdecError where the
    two models differ in a module or a parameter's shape."""
    bm, sm = _model(base), _model(sd)
    if bm is None or sm is None:
        return 0
    theirs = dict(sm.named_modules())
    n = 0
    for name, mod in bm.named_modules():
        shapes = getattr(mod, HOLLOW, None)
        if shapes is None:
            continue
        other = theirs.get(name)
        if other is None or type(other) is not type(mod):
            raise SpecdecError(f"cannot share target weights: the SD engine's target has no module '{name}' of "
                               f"type {type(mod).__name__}")
        theirs_p = dict(other.named_parameters(recurse=False))
        for pname, shape in shapes.items():
            p = theirs_p.get(pname)
            if p is None or tuple(p.shape) != shape:
                raise SpecdecError(f"cannot share target weights: '{name}.{pname}' has shape {shape} in the base "
                                   f"engine, {None if p is None else tuple(p.shape)} in the SD engine's target")
        if hasattr(mod, "cpu_linear"):
            mod.cpu_linear = other.cpu_linear
        for pname, p in mod.named_parameters(recurse=False):
            p.data = theirs_p[pname].data
        delattr(mod, HOLLOW)
        n += 1
    left = [name for name, mod in bm.named_modules() if hasattr(mod, HOLLOW)]
    if left:
        raise SpecdecError(f"cannot share target weights: {len(left)} module(s) left hollow, e.g. '{left[0]}'")
    return n
