"""The vLLM runner: config translation, metric parsing, the measure loop against a fake vllm (paired arms,
resume, partial runs), and the one-line errors. No models are needed; tests/test_vllm_engine.py runs the
real vLLM."""
from __future__ import annotations

import importlib.util
import json
import math
import time
import subprocess
import sys
import types
from dataclasses import dataclass, field

import pandas as pd
import pytest

from specdec import cli
from specdec.data import config, hardware, models, rawdata
from specdec.data.spec import Study
from specdec.engines import vllm_runner as vr
from specdec.errors import SpecdecError

S = Study.from_dict  # the engine helpers take the parsed config


def cell(**kw):
    base = {"mode": "static", "batch": 4, "k": 3, "proposer": "draft", "temperature": 0.0, "alpha": None,
            "quant": "none", "rate": None, "context": None}
    return {**base, **kw}


@pytest.fixture
def cfg():
    return config.load_study("batch", "h100")  # no h100 overrides: the shipped pair and generation settings


# ------------------------------------------------------------------ config translation

def test_draft_cell_becomes_draft_model_speculation(cfg):
    kw = vr.llm_kwargs(S(cfg), cell(batch=8, k=3))
    # the pair has local folders (converted GGUFs): named, not converted, until a run resolves them
    assert kw["model"] == "local:qwen2.5-coder-1.5b-instruct-q4_k_m"
    assert kw["speculative_config"] == {"method": "draft_model", "model": "local:qwen2.5-coder-0.5b-instruct-awq-q5",
                                        "num_speculative_tokens": 3}
    assert kw["max_num_seqs"] == 8
    assert vr.llm_kwargs(S(cfg), cell(batch=8, k=3), max_num_seqs=64)["max_num_seqs"] == 64
    assert kw["skip_tokenizer_init"] is True  # prompts go in as token ids
    assert kw["seed"] == cfg["seed"] == 0
    assert kw["disable_log_stats"] is False  # else get_metrics() has no spec-decode counters
    assert kw["enable_prefix_caching"] is False
    assert kw["max_model_len"] == 384 + 64 + 64
    assert "quantization" not in kw


def test_ngram_cell_uses_generation_lookup_window(cfg):
    cfg["generation"].update(ngram_max=4, ngram_min=2)
    spec = vr.llm_kwargs(S(cfg), cell(proposer="ngram", k=5))["speculative_config"]
    assert spec == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def test_ngram_defaults_match_the_torch_engine(cfg):
    spec = vr.speculative_config(S(cfg), cell(proposer="ngram", k=2))
    assert (spec["prompt_lookup_max"], spec["prompt_lookup_min"]) == (3, 1)


@pytest.mark.parametrize("c", [cell(k=0, proposer="none"), cell(k=0), cell(k=4, proposer="none")])
def test_no_speculation_has_no_speculative_config(cfg, c):
    kw = vr.llm_kwargs(S(cfg), c)
    assert "speculative_config" not in kw
    assert vr.speculative_config(S(cfg), c) is None


def test_eagle_uses_the_pairs_eagle_head(cfg):
    cfg["pair"] = "llama3.1-8b/eagle"
    kw = vr.llm_kwargs(S(cfg), cell(proposer="eagle", k=4))
    assert kw["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert kw["speculative_config"] == {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
                                        "num_speculative_tokens": 4}


def test_eagle3_needs_an_eagle3_head(cfg, monkeypatch):
    spec = models.PairSpec("x/eagle3", models.HubSource("t", "meta-llama/Llama-3.1-8B-Instruct"),
                           models.HubSource("d", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
                           hub_target="meta-llama/Llama-3.1-8B-Instruct",
                           hub_draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    monkeypatch.setitem(models.PAIRS, "x/eagle3", spec)
    cfg["pair"] = "x/eagle3"
    assert vr.speculative_config(S(cfg), cell(proposer="eagle3", k=2)) == {
        "method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 2}
    with pytest.raises(SpecdecError, match="EAGLE head"):
        vr.speculative_config(S(cfg), cell(proposer="draft", k=2))


def test_fp8_quantizes_target_and_draft(cfg):
    kw = vr.llm_kwargs(S(cfg), cell(quant="fp8"))
    assert kw["quantization"] == "fp8"
    assert kw["speculative_config"]["quantization"] == "fp8"
    assert "quantization" not in vr.llm_kwargs(S(cfg), cell(quant="fp8", proposer="ngram"))["speculative_config"]


def test_vllm_section_of_the_config_is_merged_last(cfg):
    cfg["vllm"] = {"gpu_memory_utilization": 0.5, "dtype": "bfloat16"}
    kw = vr.llm_kwargs(S(cfg), cell())
    assert (kw["gpu_memory_utilization"], kw["dtype"]) == (0.5, "bfloat16")


def test_local_pairs_resolve_to_saved_folders(cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    cfg["pair"] = "tiny-vllm"
    kw = vr.llm_kwargs(S(cfg), cell(), resolve=True)
    for path in (kw["model"], kw["speculative_config"]["model"]):
        assert path.startswith(str(tmp_path)) and (tmp_path / path / "config.json").exists()


def test_a_static_batch_gets_kv_cache_for_all_its_sequences(cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    cfg["pair"], cfg["dtype"] = "tiny-vllm", "float32"
    cfg["vllm"] = {"kv_cache_memory_bytes": 1 << 20}
    st = S(cfg)
    kw = vr.llm_kwargs(st, cell(batch=4), resolve=True)
    per = [json.loads((tmp_path / p / "config.json").read_text()) for p in (kw["model"],
                                                                          kw["speculative_config"]["model"])]
    # 2 (K and V) x layers x KV heads x head size x 4 bytes (fp32), target plus draft
    want = sum(2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["hidden_size"] // c["num_attention_heads"]
               * 4 for c in per)
    target_only = vr.llm_kwargs(st, cell(batch=4, k=0, proposer="none"), resolve=True)["kv_cache_memory_bytes"]
    assert want > 0 and target_only < kw["kv_cache_memory_bytes"]
    need = int(4 * kw["max_model_len"] * want * vr.KV_HEADROOM)
    assert kw["kv_cache_memory_bytes"] == max(1 << 20, need)
    big = vr.llm_kwargs(st, cell(batch=4), resolve=True, max_num_seqs=64)["kv_cache_memory_bytes"]
    assert big == int(64 * kw["max_model_len"] * want * vr.KV_HEADROOM) > 1 << 20
    # configured space that already suffices is kept; unresolved (hub ids, dry runs) is left alone
    cfg["vllm"] = {"kv_cache_memory_bytes": 1 << 40}
    assert vr.llm_kwargs(S(cfg), cell(batch=4), resolve=True)["kv_cache_memory_bytes"] == 1 << 40
    cfg["vllm"] = {"kv_cache_memory_bytes": 1 << 20}
    assert vr.llm_kwargs(S(cfg), cell(batch=64))["kv_cache_memory_bytes"] == 1 << 20


def test_env_of_the_config_is_not_an_llm_argument(cfg):
    cfg["vllm"] = {"enforce_eager": True, "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": 0}}
    kw = vr.llm_kwargs(S(cfg), cell())
    assert kw["enforce_eager"] is True and "env" not in kw
    assert vr.engine_env(S(cfg)) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cfg["vllm"] = {"env": ["x"]}
    with pytest.raises(SpecdecError, match="vllm.env must be a mapping"):
        vr.engine_env(S(cfg))


def test_sampling_kwargs(cfg):
    assert vr.sampling_kwargs(S(cfg), cell(temperature=1)) == {"temperature": 1.0, "max_tokens": 64, "ignore_eos": True,
                                                            "detokenize": False}
    cfg["generation"]["ignore_eos"] = False
    assert vr.sampling_kwargs(S(cfg), cell(), max_tokens=4) == {"temperature": 0.0, "max_tokens": 4, "ignore_eos": False,
                                                            "detokenize": False}


@pytest.mark.parametrize("pair, c, msg", [
    (None, cell(mode="forward", context=256), "static and serve cells only, not mode 'forward'"),
    (None, cell(mode="poisson", rate=4.0), "not mode 'poisson'"),
    (None, cell(alpha=0.5), "no synthetic acceptance"),
    (None, cell(quant="int8"), "quant 'int8'"),
    ("llama3.1-8b/eagle", cell(proposer="draft"), "is an EAGLE head"),
    ("llama3.1-8b/eagle", cell(proposer="eagle3"), "needs an EAGLE3 head"),
    (None, cell(proposer="eagle"), "needs an EAGLE head"),
    (None, cell(proposer="medusa"), "unknown proposer 'medusa'"),
])
def test_unsupported_cells_are_one_line_errors(cfg, pair, c, msg):
    if pair:
        cfg["pair"] = pair
    with pytest.raises(SpecdecError) as err:
        vr.llm_kwargs(S(cfg), c)
    assert msg in str(err.value)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ metrics (objects shaped like vllm.v1.metrics.reader)

@dataclass
class Counter:
    name: str
    labels: dict = field(default_factory=dict)
    value: int = 0


@dataclass
class Vector:
    name: str
    labels: dict = field(default_factory=dict)
    values: list = field(default_factory=list)


@dataclass
class Gauge:
    name: str
    labels: dict = field(default_factory=dict)
    value: float = 0.0


def snapshot(drafts, drafted, accepted, per_pos, engine="0"):
    lab = {"engine": engine, "model_name": "m"}
    return [Gauge("vllm:num_requests_running", lab, 3.0), Counter("vllm:prompt_tokens", lab, 999),
            Counter("vllm:spec_decode_num_drafts", lab, drafts),
            Counter("vllm:spec_decode_num_draft_tokens", lab, drafted),
            Counter("vllm:spec_decode_num_accepted_tokens", lab, accepted),
            Vector("vllm:spec_decode_num_accepted_tokens_per_pos", lab, per_pos)]


def test_spec_counters_reads_only_spec_decode_metrics():
    got = vr.spec_counters(snapshot(10, 30, 18, [8, 6, 4]))
    assert got == {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 18,
                   "num_accepted_tokens_per_pos": [8, 6, 4]}


def test_spec_counters_sum_over_engines_and_accept_total_suffix_and_per_label_positions():
    metrics = snapshot(10, 30, 18, [8, 6, 4]) + snapshot(2, 6, 1, [1, 0, 0], engine="1")
    metrics += [Counter("vllm:spec_decode_num_drafts_total", {}, 5),
                Counter("vllm:spec_decode_num_accepted_tokens_per_pos", {"position": "3"}, 7)]
    got = vr.spec_counters(metrics)
    assert got["num_drafts"] == 17
    assert got["num_draft_tokens"] == 36
    assert got["num_accepted_tokens_per_pos"] == [9, 6, 4, 7]


def test_spec_counters_without_speculation_are_zero():
    assert vr.spec_counters([Gauge("vllm:kv_cache_usage_perc", {}, 0.1)]) == {
        "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": []}
    assert vr.spec_counters(None)["num_drafts"] == 0


def test_acceptance_from_per_position_counts():
    before = vr.spec_counters(snapshot(4, 12, 2, [2, 0, 0]))  # the warm-up batch
    after = vr.spec_counters(snapshot(14, 42, 20, [10, 6, 4]))
    delta = vr.counters_delta(after, before)
    assert delta == {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 18,
                     "num_accepted_tokens_per_pos": [8, 6, 4]}
    s = vr.acceptance_summary(delta)
    assert s["acceptance_rate"] == pytest.approx(0.6)
    assert s["mean_accepted_tokens"] == pytest.approx(1.8)
    assert s["mean_acceptance_length"] == pytest.approx(2.8)
    assert s["per_position_acceptance"] == pytest.approx([0.8, 0.6, 0.4])
    assert sum(delta["num_accepted_tokens_per_pos"]) == delta["num_accepted_tokens"]
    json.dumps(s)  # goes to acceptance.json as is


def test_counters_delta_pads_a_longer_vector_and_accepts_no_before():
    after = {"num_drafts": 3, "num_draft_tokens": 9, "num_accepted_tokens": 4, "num_accepted_tokens_per_pos": [2, 1, 1]}
    assert vr.counters_delta(after, {"num_drafts": 1, "num_draft_tokens": 3, "num_accepted_tokens": 1,
                                     "num_accepted_tokens_per_pos": [1]})["num_accepted_tokens_per_pos"] == [1, 1, 1]
    assert vr.counters_delta(after, None) == after


def test_acceptance_without_drafts_is_undefined_not_zero():
    s = vr.acceptance_summary({"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                               "num_accepted_tokens_per_pos": []})
    assert s["acceptance_rate"] is None and s["mean_acceptance_length"] is None
    assert s["per_position_acceptance"] == []


@dataclass
class StateStats:  # vllm.v1.metrics.stats.RequestStateStats
    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    num_generation_tokens: int = 0


def test_request_times_from_v1_stats_are_relative_to_the_call():
    m = StateStats(arrival_time=5000.002, scheduled_ts=100.01, first_token_ts=100.05, last_token_ts=100.9)
    got = vr.request_times(m, mono0=100.0, wall0=5000.0, batch_s=1.0)
    assert got == pytest.approx({"arrival_s": 0.002, "admitted_s": 0.01, "first_token_s": 0.05, "finish_s": 0.9})


def test_request_times_fall_back_without_or_with_bad_stamps():
    got = vr.request_times(None, 0.0, 0.0, 2.5)
    assert got["finish_s"] == 2.5 and got["admitted_s"] == 0.0 and math.isnan(got["first_token_s"])
    bad = StateStats(scheduled_ts=0.0, first_token_ts=50.0, last_token_ts=99.0)  # unset / other clock
    got = vr.request_times(bad, mono0=100.0, wall0=0.0, batch_s=2.5)
    assert got["finish_s"] == 2.5 and math.isnan(got["first_token_s"])


def test_request_times_from_legacy_wall_clock_metrics():
    legacy = types.SimpleNamespace(arrival_time=10.0, first_scheduled_time=10.1, first_token_time=10.2,
                                   finished_time=11.0)
    got = vr.request_times(legacy, mono0=0.0, wall0=10.0, batch_s=1.5)
    assert got == pytest.approx({"arrival_s": 0.0, "admitted_s": 0.1, "first_token_s": 0.2, "finish_s": 1.0})


# ------------------------------------------------------------------ the GPU path against a fake vllm

class FakeLLM:
    """Enough of vllm.LLM: generate() returns RequestOutput-like objects; counters grow per call."""

    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.closed = kwargs, [], False
        self.spec = kwargs.get("speculative_config")
        self.totals = [0, 0, 0, [0, 0, 0]]
        FakeLLM.instances.append(self)
        self.llm_engine = types.SimpleNamespace(shutdown=self._shutdown)

    def _shutdown(self):
        self.closed = True

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append((len(prompts), params.kw["max_tokens"]))
        if self.spec:  # each request: 2 drafts of 3 tokens, 3 accepted (2 at position 0, 1 at position 1)
            n = len(prompts)
            self.totals = [self.totals[0] + 2 * n, self.totals[1] + 6 * n, self.totals[2] + 3 * n,
                           [self.totals[3][0] + 2 * n, self.totals[3][1] + n, self.totals[3][2]]]
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=list(range(params.kw["max_tokens"])))],
                                      metrics=None) for _ in prompts]

    def get_metrics(self):
        if not self.spec:
            return [Gauge("vllm:num_requests_running")]
        return snapshot(self.totals[0], self.totals[1], self.totals[2], self.totals[3])


class FakeParams:
    def __init__(self, **kw):
        self.kw = kw


PLIST = [{"prompt_set": "tiny", "prompt_idx": i, "ids": list(range(5 + i))} for i in range(3)]


def test_run_static_rows_and_acceptance(cfg):
    llm = FakeLLM(speculative_config={"method": "ngram"})
    cfg["prompts"]["min_requests"] = 5
    cfg["timing"].update(repeats=2, warmup_steps=4)
    reqs, batches, acc = vr.run_static({"cell": llm}, FakeParams, S(cfg), cell(batch=2), PLIST)
    assert llm.calls[0] == (2, 4)  # warm-up: one batch, warmup_steps tokens
    # 5 requests at batch 2 round up to 3 whole batches (a partial batch would not be batch size 2)
    assert llm.calls[1:] == [(2, 64), (2, 64), (2, 64)] * 2
    assert len(reqs) == 12 and len(batches) == 6
    assert [r["prompt_idx"] for r in reqs[:6]] == [0, 1, 0, 1, 2, 0]
    assert reqs[4]["rid"] == 0 and reqs[4]["batch_idx"] == 1 and reqs[4]["prompt_tokens"] == 7
    assert [b["batch_idx"] for b in batches] == [0, 0, 1, 1, 2, 2]  # batch by batch, its repeats together
    assert {b["arm"] for b in batches} == {"cell"} and [b["pair"] for b in batches] == list(range(6))
    b = batches[2]
    assert (b["size"], b["new_tokens"], b["decode_tokens"]) == (2, 128, 126)
    assert b["output_ids"] == [list(range(64))] * 2
    assert math.isnan(b["prefill_s"]) and math.isnan(b["steps"]) and b["decode_s"] >= 0
    assert b["decode_s"] == b["call_s"]  # no per-request first-token stamps: the prefill cannot be split off
    assert reqs[0]["finish_s"] == batches[0]["call_s"]  # no per-request stats: batch end
    assert acc["num_drafts"] == 24  # the warm-up's 4 drafts are not counted
    assert acc["acceptance_rate"] == pytest.approx(0.5)
    assert acc["per_position_acceptance"] == pytest.approx([1.0, 0.5, 0.0])


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """A machine that claims a CUDA H100, a fake vllm module, raw data under tmp_path."""
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path))
    monkeypatch.setattr(hardware, "describe_machine", lambda: {"cuda": True, "gpu": "NVIDIA H100 80GB HBM3"})
    monkeypatch.setattr(rawdata, "versions", lambda: {"python": "x"})
    monkeypatch.setattr(vr, "have_vllm", lambda: True)
    monkeypatch.setattr(vr, "ONE_ENGINE_PER_PROCESS", False)  # the fake engines share one process
    monkeypatch.setattr(vr, "_free_memory", lambda: None)
    monkeypatch.setattr(vr.probe, "read_gbs", lambda: {"read_gbs": 10.0})
    monkeypatch.setattr(vr, "_tokenized_prompts", lambda cfg: PLIST)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM, SamplingParams=FakeParams,
                                                                   __version__="0.0-fake"))
    monkeypatch.setattr(vr.models, "model_dir", lambda src: _model_folder(tmp_path / "models" / src.name))
    FakeLLM.instances = []
    return tmp_path


def _model_folder(path):
    """A converted-model folder as vLLM's arguments name it (config.json only: the fake LLM reads nothing)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    return str(path)


def test_measure_writes_the_torch_raw_format_and_resumes(fake_gpu):
    res = vr.measure("batch", "h100", limit=3, echo=lambda *_: None)
    assert res == {"cells": 91, "ran": 3, "pending": 88, "unsupported": 0}  # cells still missing after --limit
    assert [llm.closed for llm in FakeLLM.instances] == [True] * len(FakeLLM.instances)
    complete, partial = rawdata.scan("h100", "batch")
    assert len(complete) == 3 and not partial
    meta = rawdata.read_meta(complete[0])
    assert meta["engine"] == "vllm" and meta["versions"]["vllm"] == "0.0-fake"
    assert meta["run_id"].startswith(config.cell_id(meta["cell"]) + "-")
    assert json.loads((complete[0] / "acceptance.json").read_text())["num_drafts"] >= 0
    req = rawdata.load("batch", "h100", "requests", warn=lambda *_: None)
    assert set(req["engine"]) == {"vllm"}
    assert {"repeat", "batch_idx", "rid", "prompt_set", "prompt_idx", "prompt_tokens", "new_tokens", "arrival_s",
            "admitted_s", "first_token_s", "finish_s"} <= set(req.columns)
    bat = pd.read_parquet(complete[0] / "batches.parquet")
    assert list(bat.columns) == ["repeat", "batch_idx", "arm", "pair", "size", "prefill_s", "decode_s", "steps",
                                 "new_tokens", "decode_tokens", "call_s", "step_s", "verify_s", "draft_s", "other_s",
                                 "engine_steps", "output_ids"]
    assert bat["draft_s"].isna().all()  # the fake has no in-process model runner to time
    assert meta["probe"] == {"before": {"read_gbs": 10.0}, "after": {"read_gbs": 10.0}}
    again = vr.measure("batch", "h100", limit=1, dry_run=True, echo=lambda *_: None)
    assert again["pending"] == 88 and again["ran"] == 0  # a dry run reports every missing cell
    assert len(rawdata.scan("h100", "batch")[0]) == 3  # finished cells are kept, not redone


def test_measure_sets_partial_runs_aside_and_skips_finished(fake_gpu):
    cfg = config.load_study("batch", "h100")
    chash = config.config_hash(cfg)
    cells = config.cells(cfg)
    torch_done = rawdata.run_dir("h100", "batch", config.run_name(cells[0], chash))
    rawdata.write_run(torch_done, {}, {"engine": "torch"})
    vllm_done = rawdata.run_dir("h100", "batch", config.run_name(cells[2], config.config_hash(cfg, "vllm"), "vllm"))
    rawdata.write_run(vllm_done, {}, {"engine": "vllm"})
    broken = rawdata.run_dir("h100", "batch", config.run_name(cells[1], chash, "vllm"))
    broken.mkdir(parents=True)
    lines = []
    res = vr.measure("batch", "h100", dry_run=True, echo=lines.append)
    assert res["pending"] == len(cells) - 1  # a torch run of the same cell does not count for vLLM
    assert any("would set aside interrupted run" in line for line in lines)
    assert broken.exists()  # a dry run changes nothing on disk
    res0 = vr.measure("batch", "h100", limit=0, echo=lines.append)
    assert res0["ran"] == 0
    assert any("interrupted run set aside" in line for line in lines)
    assert not broken.exists()


def test_measure_skips_unsupported_cells_and_refuses_a_study_with_none(fake_gpu):
    lines = []
    res = vr.measure("acceptance", "h100", dry_run=True, echo=lines.append)
    assert res["unsupported"] == 18 and res["pending"] == 7
    assert sum(line.startswith("skipping ") for line in lines) == 18
    with pytest.raises(SpecdecError, match="no cell of study 'hardware' can run on vLLM"):
        vr.measure("hardware", "h100", dry_run=True, echo=lines.append)


# ------------------------------------------------------------------ without vllm: one line, exit 2

def test_cli_without_vllm_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(vr, "have_vllm", lambda: False)
    with pytest.raises(SystemExit) as ex:
        cli.main(["measure", "--study", "batch", "--gpu", "h100", "--engine", "vllm"])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert err == f"error: {vr.MISSING}\n"


def test_cli_rejects_an_unknown_engine(capsys):
    with pytest.raises(SystemExit) as ex:
        cli.main(["measure", "--study", "batch", "--gpu", "h100", "--engine", "tensorrt"])
    assert ex.value.code == 2
    assert capsys.readouterr().err == "error: unknown engine 'tensorrt'; known: torch, vllm\n"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_python_m_specdec_without_vllm():
    proc = subprocess.run([sys.executable, "-m", "specdec", "measure", "--study", "batch", "--gpu", "h100",
                           "--engine", "vllm"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {vr.MISSING}"]
    assert proc.stdout == ""


class StampedLLM(FakeLLM):
    """Outputs carry V1 per-request stamps: first tokens at +10 ms and +20 ms, the call lasts 50 ms."""

    def generate(self, prompts, params, use_tqdm=True):
        mono = time.monotonic()
        outs = super().generate(prompts, params, use_tqdm)
        time.sleep(0.05)
        for i, o in enumerate(outs):
            o.metrics = StateStats(arrival_time=time.time(), scheduled_ts=mono, first_token_ts=mono + 0.01 * (i + 1),
                                   last_token_ts=mono + 0.04)
        return outs


def test_vllm_decode_seconds_exclude_the_prefill_like_the_torch_engine(cfg):
    cfg["prompts"]["min_requests"] = 2
    _, batches, _ = vr.run_static({"cell": StampedLLM()}, FakeParams, S(cfg), cell(batch=2), PLIST)
    b = batches[0]
    assert b["prefill_s"] == pytest.approx(0.02, abs=0.005)
    assert b["decode_s"] == pytest.approx(b["call_s"] - b["prefill_s"])


def test_paired_cells_alternate_arms_on_two_engines(cfg):
    cfg["prompts"]["min_requests"] = 4
    cfg["timing"].update(repeats=2, paired=True)
    sd, base = FakeLLM(speculative_config={"method": "ngram"}), FakeLLM()
    reqs, batches, acc = vr.run_static({"base": base, "cell": sd}, FakeParams, S(cfg), cell(batch=2), PLIST)
    assert [b["arm"] for b in batches] == ["cell", "base", "base", "cell"] * 2  # A B, B A, ...
    assert [b["pair"] for b in batches] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert len(sd.calls) == len(base.calls) == 5  # a warm-up each, then one call per pair
    assert len(reqs) == 8  # requests of the cell's own arm only
    assert acc["num_drafts"] == 16  # counters of the SD engine over its timed batches


def test_measure_keeps_the_base_engine_for_paired_cells(fake_gpu, monkeypatch):
    real = config.load_study

    def paired(study, profile=None):
        cfg = real(study, profile)
        cfg["timing"]["paired"] = True
        return cfg

    monkeypatch.setattr(config, "load_study", paired)
    monkeypatch.setattr(vr.cfgmod, "load_study", paired)
    vr.measure("batch", "h100", limit=3, echo=lambda *_: None)  # bs1 k0, bs1 k1 draft, bs1 k1 ngram
    started = [("speculative_config" in llm.kwargs, llm.kwargs["max_num_seqs"]) for llm in FakeLLM.instances]
    assert started == [(False, 1), (True, 1), (True, 1)]  # one base engine for the whole run, beside each SD one
    assert FakeLLM.instances[1].closed and all(llm.closed for llm in FakeLLM.instances)
    bat = rawdata.load("batch", "h100", "batches", warn=lambda *_: None)
    assert set(bat[bat["k"] > 0]["arm"]) == {"cell", "base"} and set(bat[bat["k"] == 0]["arm"]) == {"cell"}
    # the SD engine starts last, also in a fresh process: a later engine would unregister its counters
    FakeLLM.instances = []
    vr.measure("batch", "h100", only="bs2-k1-draft-t0", echo=lambda *_: None)
    assert [("speculative_config" in llm.kwargs) for llm in FakeLLM.instances] == [False, True]
    # counters that read no drafts for a draft-model cell (lost) fail the cell: nothing is written
    zero = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": []}
    monkeypatch.setattr(vr, "spec_counters", lambda metrics: dict(zero))
    with pytest.raises(SpecdecError, match="counted no drafts for SD cell bs4-k1-draft-t0"):
        vr.measure("batch", "h100", only="bs4-k1-draft-t0", echo=lambda *_: None)
    assert not list(fake_gpu.glob("h100/batch/bs4-k1-draft-t0-*/meta.json"))


def test_a_model_folder_without_config_is_one_line(tmp_path):
    eng = vr.Engines(FakeLLM)
    with pytest.raises(SpecdecError) as err:
        eng.get({"model": str(tmp_path)}, "bs1-k0-none-t0")
    assert "has no config.json; vLLM cannot load it" in str(err.value) and "\n" not in str(err.value)


def test_an_engine_that_fails_to_start_is_one_line(tmp_path):
    def broken(**kw):
        raise RuntimeError("Engine core initialization failed. See root cause above.\nmore")
    with pytest.raises(SpecdecError) as err:
        vr.Engines(broken).get({"model": "some/hub-id"}, "bs1-k0-none-t0")
    assert str(err.value) == ("vLLM could not start the engine for bs1-k0-none-t0 (some/hub-id): RuntimeError: "
                              "Engine core initialization failed. See root cause above.")


def test_each_engine_configuration_runs_in_its_own_process(fake_gpu, monkeypatch):
    """vLLM 0.32 cannot start an engine after an n-gram engine in one process: measure hands each engine
    configuration (cells that differ only in batch size share one) to a child `specdec measure --only`, and
    stops at the first child that fails."""
    import subprocess as sp
    monkeypatch.setattr(vr, "ONE_ENGINE_PER_PROCESS", True)
    calls = []

    def child(cmd):
        calls.append(cmd)
        return 0 if len(calls) < 3 else 1
    monkeypatch.setattr(sp, "call", child)
    lines = []
    with pytest.raises(SpecdecError, match="child process for .* failed \\(exit 1\\)"):
        vr.measure("batch", "h100", only="bs1-k1-*,bs2-k1-*,bs1-k0-*", echo=lines.append)
    ids = [c[c.index("--only") + 1] for c in calls]
    assert ids == ["bs1-k0-none-t0", "bs1-k1-draft-t0,bs2-k1-draft-t0", "bs1-k1-ngram-t0,bs2-k1-ngram-t0"]
    assert all(c[:3] == [sys.executable, "-m", "specdec"] and c[c.index("--engine") + 1] == "vllm" for c in calls)
    assert FakeLLM.instances == [] and sum("in a child process" in x for x in lines) == 3


def _fake_llm(model):
    """An object with vllm_steps.model_runner's path to `model` (an in-process engine's layout)."""
    ns = types.SimpleNamespace
    return ns(llm_engine=ns(engine_core=ns(engine_core=ns(model_executor=ns(driver_worker=ns(worker=ns(
        model_runner=ns(model=model))))))))


def _tiny_target(seed):
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    for mod in model[1:2]:  # vLLM's CPU dispatch: a closure over the layer's own (packed) weight
        weight = mod.weight.detach().clone()
        mod.cpu_linear = lambda x, w, b, _w=weight: torch.nn.functional.linear(x, _w, b)
    return model


def test_shared_target_weights_are_the_sd_engines_own():
    from specdec.engines import vllm_share
    base, sd = _tiny_target(0), _tiny_target(1)
    assert vllm_share.hollow(_fake_llm(base)) == 3
    assert base[0].weight.numel() == 0 and base[1].weight.numel() == 0
    with pytest.raises(RuntimeError, match="released"):
        base[1].cpu_linear(None, None, None)
    assert vllm_share.share(_fake_llm(base), _fake_llm(sd)) == 3
    assert base[1].cpu_linear is sd[1].cpu_linear
    for mine, theirs in zip(base.parameters(), sd.parameters()):
        assert mine.data_ptr() == theirs.data_ptr()
    # an engine not in this process (no model runner) is left alone
    assert vllm_share.hollow(types.SimpleNamespace()) == 0


def test_sharing_refuses_a_different_target():
    import torch
    from specdec.engines import vllm_share
    base, other = _tiny_target(0), _tiny_target(1)
    other[1] = torch.nn.Linear(4, 5)
    other[1].cpu_linear = None
    vllm_share.hollow(_fake_llm(base))
    with pytest.raises(SpecdecError, match=r"cannot share target weights: '1.weight' has shape \(4, 4\)"):
        vllm_share.share(_fake_llm(base), _fake_llm(other))


def test_paired_engines_share_the_target_when_only_kv_space_or_speculation_differ(monkeypatch):
    from specdec.engines import vllm_share
    calls = []
    monkeypatch.setattr(vllm_share, "hollow", lambda llm: calls.append("hollow") or 5)
    monkeypatch.setattr(vllm_share, "share", lambda base, sd: calls.append("share") or 5)
    eng = vr.Engines(lambda **kw: types.SimpleNamespace(kw=kw))
    base = {"model": "m/t", "dtype": "float32", "max_num_seqs": 32, "kv_cache_memory_bytes": 600}
    sd = {**base, "kv_cache_memory_bytes": 900, "speculative_config": {"method": "draft_model", "model": "m/d"}}
    assert eng.paired(base, sd, "c")[2] == 5 and calls == ["hollow", "share"]
    eng.close()
    calls.clear()
    assert eng.paired(base, {**sd, "dtype": "bfloat16"}, "c")[2] == 0 and calls == []
