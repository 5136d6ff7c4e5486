"""Where a vLLM step's time goes: drafting, the target's forward (verification), and the rest.

vLLM's metrics give no per-step timing split. When the engine runs inside the measuring process (the CPU
profiles' config: VLLM_ENABLE_V1_MULTIPROCESSING=0 and the uni executor), its model runner is an object here,
and StepTimer wraps three of its methods on that instance (vLLM's code is not changed):
  * execute_model + sample_tokens: one engine step (step_s, engine_steps counts execute_model calls);
  * _model_forward: the target model's forward over the scheduled tokens (verify_s; in a prefill step, the
    prefill);
  * propose_draft_token_ids: the proposer (draft_s: the draft model's k forwards, or the n-gram lookup).
Each is timed with perf_counter around the call (the CPU runs synchronously). A call's totals include its
prefill steps. Where the engine core runs in another process, `attach` returns None and the columns stay NaN.
Written against vLLM 0.32 (v1/worker/gpu_model_runner.py, which CPUModelRunner extends).
"""
from __future__ import annotations

import time

WRAPPED = {"execute_model": "step_s", "sample_tokens": "step_s", "_model_forward": "verify_s",
           "propose_draft_token_ids": "draft_s"}


def model_runner(llm):
    """The in-process model runner of a vllm.LLM, or None (engine core in another process, or another layout)."""
    obj = getattr(getattr(llm, "llm_engine", None), "engine_core", None)  # InprocClient when in-process
    for attr in ("engine_core", "model_executor", "driver_worker", "worker", "model_runner"):
        obj = getattr(obj, attr, None)
        if obj is None:
            return None
    return obj


class StepTimer:
    """Accumulates seconds per part (WRAPPED values) and engine steps on one model runner."""

    def __init__(self, runner):
        self.runner = runner
        self.reset()
        for name, part in WRAPPED.items():
            fn = getattr(runner, name, None)
            if callable(fn):
                setattr(runner, name, self._timed(fn, part, count=name == "execute_model"))

    def _timed(self, fn, part: str, count: bool):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[part] += time.perf_counter() - t
                if count:
                    self.totals["engine_steps"] += 1
        return wrapper

    def reset(self) -> None:
        self.totals = {"step_s": 0.0, "verify_s": 0.0, "draft_s": 0.0, "engine_steps": 0}

    def read(self) -> dict:
        """Totals since the last reset: step_s, verify_s, draft_s, other_s = step_s - verify_s - draft_s (s),
        engine_steps (execute_model calls)."""
        out = dict(self.totals)
        out["other_s"] = out["step_s"] - out["verify_s"] - out["draft_s"]
        return out


def attach(llm) -> StepTimer | None:
    """A StepTimer on the LLM's in-process model runner (attached once per engine), else None."""
    runner = model_runner(llm)
    if runner is None:
        return None
    timer = getattr(runner, "_specdec_timer", None)
    if timer is None:
        timer = StepTimer(runner)
        runner._specdec_timer = timer
    return timer
