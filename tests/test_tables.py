"""The processed-tables layer: one schema for both engines, one acceptance definition, build/ never stale."""
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from specdec.data import rawdata, tables
from specdec.errors import SpecdecError
from specdec.report import analysis

CELL = {"mode": "static", "batch": 2, "k": 3, "proposer": "ngram", "temperature": 0.0, "alpha": None,
        "quant": "none", "rate": None, "context": None, "requests": None}


def test_position_counts_follow_the_one_definition():
    pc = tables.position_counts(np.array([0, 2, 3]), 3, proposed=np.array([0, 3, 3]))
    assert pc["tried"].tolist() == [3, 2, 2]  # a step tries j when it accepted j-1 (every step tries 1)
    assert pc["accepted"].tolist() == [2, 2, 1]
    assert pc["proposed"].tolist() == [2, 2, 2]  # the step that proposed nothing tried position 1, rejected


def _torch_run(root, lengths_by_rid: dict[int, list[int]], proposed: int):
    """A torch-format run: one static batch, one step record per step with per-sequence lists."""
    rids = sorted(lengths_by_rid)
    n_steps = len(lengths_by_rid[rids[0]])
    steps = pd.DataFrame([{"repeat": 0, "batch_idx": 0, "step": i, "batch": len(rids), "draft_s": 0.01,
                           "verify_s": 0.1, "other_s": 0.001, "accepted": [lengths_by_rid[r][i] for r in rids],
                           "proposed": [proposed] * len(rids), "active": [True] * len(rids), "rids": rids,
                           "end_s": 0.1 * i} for i in range(n_steps)])
    reqs = pd.DataFrame([{"repeat": 0, "batch_idx": 0, "rid": r, "prompt_set": "humaneval", "prompt_idx": r,
                          "prompt_tokens": 10, "new_tokens": 20} for r in rids])
    batches = pd.DataFrame([{"repeat": 0, "batch_idx": 0, "size": len(rids), "prefill_s": 0.1, "decode_s": 1.0,
                             "steps": n_steps, "new_tokens": 40, "decode_tokens": 38}])
    rawdata.write_run(root / "mixed" / "acceptance" / "torch-run", {"steps": steps, "requests": reqs,
                      "batches": batches}, {"run_id": "torch-run", "profile": "mixed", "cell": CELL,
                                            "config": {"pair": "p"}, "engine": "torch"})


def _vllm_run(root, lengths: list[int], k: int):
    per_pos = [int(sum(n >= j for n in lengths)) for j in range(1, k + 1)]
    folder = root / "mixed" / "acceptance" / "vllm-run"
    batches = pd.DataFrame([{"repeat": 0, "batch_idx": 0, "size": 2, "prefill_s": np.nan, "decode_s": 1.0,
                             "steps": np.nan, "new_tokens": 40, "decode_tokens": 38}])
    rawdata.write_run(folder, {"batches": batches}, {"run_id": "vllm-run", "profile": "mixed",
                      "cell": {**CELL, "batch": 4}, "config": {"pair": "p"}, "engine": "vllm"})
    (folder / "acceptance.json").write_text(json.dumps({
        "num_drafts": len(lengths), "num_draft_tokens": k * len(lengths), "num_accepted_tokens": sum(lengths),
        "num_accepted_tokens_per_pos": per_pos}))


@pytest.fixture
def mixed(tmp_path, monkeypatch):
    """The same accept lengths recorded by both engines (the vLLM run as batch 4 to keep the cells apart)."""
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path / "raw"))
    monkeypatch.setenv("SPECDEC_BUILD", str(tmp_path / "build"))
    by_rid = {0: [0, 3, 1, 2, 0], 1: [3, 3, 0, 1, 2]}
    _torch_run(tmp_path / "raw", by_rid, proposed=3)
    _vllm_run(tmp_path / "raw", by_rid[0] + by_rid[1], 3)
    return tmp_path


def test_both_engines_give_the_same_acceptance_for_the_same_steps(mixed):
    pos = analysis.position_acceptance("mixed", "acceptance")
    t, v = (pos[pos["engine"] == e].sort_values("position") for e in ("torch", "vllm"))
    assert t["tried"].tolist() == v["tried"].tolist() == [10, 7, 5]
    assert t["accepted"].tolist() == v["accepted"].tolist() == [7, 5, 3]
    lens = tables.load("mixed", "acceptance", "lengths")
    hist = lens.groupby(["engine", "length"])["count"].sum().unstack(0)
    assert (hist["torch"] == hist["vllm"]).all()
    iid = analysis.iid_prediction("mixed", "acceptance").set_index("engine")
    assert iid.loc["torch", "measured_tps"] == pytest.approx(iid.loc["vllm", "measured_tps"]) == 1.0 + 15 / 10


def test_written_tables_are_read_back_and_never_stale(mixed):
    subprocess.run([sys.executable, "-m", "specdec", "tables", "--gpu", "mixed"], check=True, capture_output=True)
    out = mixed / "build" / "mixed" / "tables" / "acceptance"
    assert {p.stem for p in out.glob("*.parquet")} == {"runs", "batches", "requests", "steps", "lengths",
                                                         "positions"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(r[0] for r in manifest["runs"]) == ["torch-run", "vllm-run"]
    # the written file is what load() returns while the raw runs are unchanged
    marked = pd.read_parquet(out / "runs.parquet").assign(config_sha256="from-build")
    marked.to_parquet(out / "runs.parquet", index=False)
    tables._read_cached.cache_clear()
    assert (tables.load("mixed", "acceptance", "runs")["config_sha256"] == "from-build").all()

def test_a_new_run_makes_build_stale(mixed):
    subprocess.run([sys.executable, "-m", "specdec", "tables", "--gpu", "mixed"], check=True, capture_output=True)
    folder = mixed / "raw" / "mixed" / "acceptance" / "vllm-run"
    meta = json.loads((folder / "meta.json").read_text())
    newer = mixed / "raw" / "mixed" / "acceptance" / "vllm-run-2"
    newer.mkdir()
    for f in folder.iterdir():
        (newer / f.name).write_bytes(f.read_bytes())
    (newer / "meta.json").write_text(json.dumps({**meta, "run_id": "vllm-run-2"}))
    assert sorted(tables.load("mixed", "acceptance", "runs")["run_id"]) == ["torch-run", "vllm-run", "vllm-run-2"]


def test_missing_tables_say_why(mixed):
    with pytest.raises(SpecdecError, match="no 'forwards' table"):
        tables.load("mixed", "acceptance", "forwards")
    with pytest.raises(SpecdecError, match="unknown table"):
        tables.load("mixed", "acceptance", "nope")
