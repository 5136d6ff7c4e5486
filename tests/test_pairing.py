"""Paired, interleaved measurement (pairing.py): the torch engine runs a no-SD arm beside every SD cell,
alternating which goes first, and analysis takes the speedup per pair, so machine drift between pairs cancels."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specdec.data import rawdata
from specdec.data.spec import Cell, Study
from specdec.engines import harness, pairing
from specdec.report import analysis


def test_order_alternates_from_pair_to_pair():
    assert [pairing.order(i) for i in range(4)] == [("cell", "base"), ("base", "cell")] * 2


def test_only_sd_static_cells_of_paired_studies_are_paired():
    paired = Study.from_dict({"pair": "tiny", "timing": {"paired": True}})
    plain = Study.from_dict({"pair": "tiny"})
    assert pairing.is_paired(paired, Cell(batch=2, k=3))
    assert not pairing.is_paired(paired, Cell(batch=2, k=0))
    assert not pairing.is_paired(paired, Cell(batch=2, k=3, mode="poisson"))
    assert not pairing.is_paired(plain, Cell(batch=2, k=3))


@pytest.fixture
def raw(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path / "raw"))
    monkeypatch.setenv("SPECDEC_BUILD", str(tmp_path / "build"))
    return tmp_path / "raw"


def test_torch_engine_runs_both_arms_interleaved(raw):
    harness.measure("batch", "fixture", limit=2, echo=lambda *_: None)  # bs1 k0, then bs1 k2 draft
    b = rawdata.load("batch", "fixture", "batches", warn=lambda *_: None)
    base_cell = b[b["k"] == 0]
    assert set(base_cell["arm"]) == {"cell"}  # a k=0 cell is its own baseline
    sd = b[b["k"] == 2]
    assert list(sd["arm"]) == [a for i in range(len(sd) // 2) for a in pairing.order(i)]
    per_pair = sd.groupby("pair_idx")["arm"].apply(sorted)
    assert (per_pair.apply(lambda a: a == ["base", "cell"])).all()
    tok = sd.pivot(index="pair_idx", columns="arm", values="decode_tokens")
    assert (tok["base"] == tok["cell"]).all()  # the same prompts and lengths in both arms
    steps = sd.pivot(index="pair_idx", columns="arm", values="steps")
    assert (steps["base"] > steps["cell"]).all()  # without SD one token per step, with SD more
    meta = rawdata.read_meta(rawdata.scan("fixture", "batch")[0][0])
    assert meta["probe"]["before"]["read_gbs"] > 0 and meta["probe"]["after"]["read_gbs"] > 0
    req = rawdata.load("batch", "fixture", "requests", warn=lambda *_: None)
    assert len(req[req["k"] == 2]) == len(sd) // 2  # requests of the cell's own arm (batch 1: one per batch)


def _write(root, run_id, cell, batches):
    rawdata.write_run(root / "fixture" / "batch" / run_id, {"batches": pd.DataFrame(batches)},
                      {"study": "batch", "run_id": run_id, "profile": "fixture", "cell": cell,
                       "config": {"pair": "tiny"}, "engine": "torch"})


def test_paired_speedup_cancels_drift_that_an_unpaired_ratio_does_not(raw):
    """The machine slows down 3x over the run. SD is exactly 2x faster within every pair; the k=0 cell,
    measured early (fast), makes an unpaired ratio wrong, the paired one is exactly 2."""
    base = {"mode": "static", "batch": 2, "temperature": 0.0, "alpha": None, "quant": "none", "rate": None,
            "context": None}
    slow = np.linspace(1.0, 3.0, 8)  # seconds per 10 tokens, drifting
    _write(raw, "bs2-k0", dict(base, k=0, proposer="none"),
           [{"repeat": 0, "batch_idx": i, "size": 2, "decode_tokens": 10, "decode_s": 0.5, "steps": 5}
            for i in range(4)])
    rows = []
    for p, s in enumerate(slow):
        for arm in pairing.order(p):
            rows.append({"repeat": 0, "batch_idx": p, "arm": arm, "pair": p, "size": 2, "decode_tokens": 10,
                         "decode_s": s / (2.0 if arm == "cell" else 1.0), "steps": 5 if arm == "base" else 2})
    _write(raw, "bs2-k3", dict(base, k=3, proposer="draft"), rows)
    sp = analysis.speedup("fixture", "batch").set_index("k")
    assert sp.loc[3, "speedup"] == pytest.approx(2.0)
    assert sp.loc[3, "ci_lo"] == pytest.approx(2.0) and sp.loc[3, "ci_hi"] == pytest.approx(2.0)
    assert sp.loc[3, "note"] == "paired" and sp.loc[3, "baseline_run"] == "bs2-k3"
    unpaired = sp.loc[3, "throughput_tok_s"] / sp.loc[0, "throughput_tok_s"]
    assert unpaired < 1.0  # what comparing against the early k=0 cell would have said
    assert sp.loc[3, "n_units"] == 8  # the cell's own arm only
    tp = analysis.throughput("fixture", "batch").set_index("k")
    assert tp.loc[3, "paired_base_tok_s"] == pytest.approx(80 / slow.sum())
