"""GPU evidence without weights (issue 15): synthetic-weight models of real shapes, and acceptance replayed
from the paper's per-position traces while draft and verify passes run in full."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch

from specdec import paths
from specdec.data import config, models, traces
from specdec.engines import engine
from specdec.engines.engine import GenConfig, generate
from specdec.errors import SpecdecError

PAPER = "llama3.1-8b-h100"


def _accepted_per_step(steps, i):
    """Draft tokens sequence i kept in each step while it was active."""
    return [r["accepted"][i] for r in steps if r["active"][i]]


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_replayed_acceptance_reproduces_the_traces_tokens_per_step(proposer):
    pair = models.load_pair("tiny", torch.float64)
    reqs = traces.load(PAPER, "cnn", "eagle").requests[:3]
    accs = tuple(r.acc_len[:40] for r in reqs)
    k = 3
    cfg = GenConfig(k=k, proposer=proposer, max_new_tokens=40, replay=accs).validate()
    prompts = [pair.tokenizer.encode(t) for t in ("def f(x): return x", "hello hello hello", "abc abc")]
    eng = generate(pair.target, pair.draft, prompts, cfg, pair.tokenizer.eos_token_id)[0]
    for i, acc in enumerate(accs):
        want = [e - 1 for e in traces.steps(acc, k)[1]]
        got = _accepted_per_step(eng.steps, i)
        # every sequence counts as proposing k under replay (an n-gram miss is padding): the trace is followed
        assert got == want, (proposer, i)
        assert len(eng.seqs[i].generated) == 40


def test_replay_differs_from_the_models_own_acceptance():
    pair = models.load_pair("tiny", torch.float64)
    prompts = [pair.tokenizer.encode("def f(x): return x")]
    own = generate(pair.target, pair.draft, prompts, GenConfig(k=3, max_new_tokens=30).validate())[0]
    forced = generate(pair.target, pair.draft, prompts,
                      GenConfig(k=3, max_new_tokens=30, replay=((4,) * 30,)).validate())[0]
    assert all(r["accepted"][0] == 3 for r in forced.steps[:-1])
    assert [r["accepted"][0] for r in own.steps] != [r["accepted"][0] for r in forced.steps]


@pytest.mark.parametrize("bad", [(), ((),), ((1, 0, 2),), ((1.5,),)])
def test_bad_replay_traces_are_one_line_errors(bad):
    with pytest.raises(SpecdecError, match="replayed acceptance trace must hold"):
        GenConfig(k=3, replay=bad).validate()
    with pytest.raises(SpecdecError, match="exclude each other"):
        GenConfig(k=3, replay=((2,),), synthetic_alpha=0.5).validate()


def test_synthetic_models_have_the_exact_shapes_of_their_configs():
    for pair in ("synthetic:llama3.1-8b/llama3.2-1b", "synthetic:llama3.1-8b/eagle"):
        spec = models.pair_spec(pair)
        t, d = models.shape_config(spec.target), models.shape_config(spec.draft)
        assert t["hidden_size"] == 4096 and t["num_hidden_layers"] == 32 and t["vocab_size"] == 128256
    assert models.shape_config(models.pair_spec("synthetic:llama3.1-8b/eagle").draft)["num_hidden_layers"] == 1
    assert models.shape_config(models.pair_spec("synthetic:llama3.1-8b/llama3.2-1b").draft)["hidden_size"] == 2048
    with torch.device("meta"):  # the full 8B architecture, instantiated without memory: 8.03e9 parameters
        from transformers import AutoConfig, AutoModelForCausalLM
        fields = models.shape_config(models.pair_spec("synthetic:llama3.1-8b/llama3.2-1b").target)
        m = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    assert sum(p.numel() for p in m.parameters()) == pytest.approx(8.03e9, rel=0.001)
    tiny = models.load_pair("synthetic:tiny")
    assert tiny.target.config.hidden_size == 64 and tiny.draft.config.num_hidden_layers == 1
    assert models.weights_of("synthetic:tiny") == {"weights": "synthetic",
                                                   "shapes": ["llama-tiny-shape", "llama-tiny-head"]}
    with pytest.raises(SpecdecError, match="no tokenizer"):
        tiny.tokenizer.encode("text")


GRID = """\
description: trace-replayed batch cells on synthetic weights (CI shape)
pair: "synthetic:tiny"
dtype: float32
seed: 0
prompts: {sets: [tiny], per_set: 4, min_requests: 4, max_prompt_tokens: 48}
generation: {max_new_tokens: 24, temperature: 0.0, ignore_eos: true, ngram_match: earliest,
             acceptance_trace: llama3.1-8b-h100/cnn}
timing: {warmup_steps: 2, repeats: 1, paired: true}
grid:
  - {batch: [2], k: [3], proposer: [draft, ngram]}
"""


@pytest.fixture(scope="module")
def replay_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay-root")
    shutil.copytree(paths.configs() / "hardware", root / "configs" / "hardware")
    shutil.copytree(paths.configs() / "models", root / "configs" / "models")
    (root / "configs" / "batch.yaml").write_text(GRID)
    (root / "data" / "traces").mkdir(parents=True)
    os.symlink(paths.root() / "data" / "traces" / PAPER, root / "data" / "traces" / PAPER)
    env = dict(os.environ, SPECDEC_ROOT=str(root), SPECDEC_RAW=str(root / "raw"))
    proc = subprocess.run([sys.executable, "-m", "specdec", "measure", "--study", "batch", "--gpu", "fixture"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def test_a_replayed_measure_writes_the_raw_schema_and_follows_the_trace(replay_root):
    runs = sorted((replay_root / "raw" / "fixture" / "batch").iterdir())
    assert [r.name.split("-t0-")[0] for r in runs] == ["bs2-k3-draft", "bs2-k3-ngram"]
    for run in runs:
        meta = json.loads((run / "meta.json").read_text())
        assert meta["weights"] == "synthetic" and meta["config"]["generation"]["acceptance_trace"].endswith("/cnn")
        b = pd.read_parquet(run / "batches.parquet")
        assert set(b["arm"]) == {"cell", "base"} and (b["decode_s"] > 0).all()
        req = pd.read_parquet(run / "requests.parquet")
        assert set(req["prompt_set"]) == {"cnn"} and (req["new_tokens"] == 24).all()
    steps = pd.read_parquet(runs[0] / "steps.parquet")
    ngram_ids = {r.id for r in traces.load(PAPER, "cnn", "ngram").requests}
    first = steps[(steps["repeat"] == 0) & (steps["batch_idx"] == 0)]
    acc0 = [a[0] for a, act in zip(first["accepted"], first["active"]) if act[0]]
    # batch 0's first sequence replays the first request that has both proposers' traces
    trace0 = next(r.acc_len for r in traces.load(PAPER, "cnn", "eagle").requests if r.id in ngram_ids)
    assert acc0 == [e - 1 for e in traces.steps(trace0[:24], 3)[1]]


@pytest.mark.parametrize("spec,msg", [("llama3.1-8b-h100", "COLLECTION/DATASET"),
                                      ("llama3.1-8b-h100/gsm8k", "held out"),
                                      ("llama3.1-8b-h100/nope", "no dataset 'nope'"),
                                      ("nope/cnn", "unknown trace collection")])
def test_bad_acceptance_trace_configs_are_one_line_errors(spec, msg):
    cfg = config.load_study("batch", "fixture")
    cfg["generation"] = dict(cfg.get("generation", {}), acceptance_trace=spec)
    with pytest.raises(SpecdecError, match=msg):
        config.validate(cfg)
