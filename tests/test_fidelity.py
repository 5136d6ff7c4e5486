"""fidelity.py: the engine comparison and the batch-1 roofline, on hand-made speedup rows."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specdec.data import models
from specdec.errors import SpecdecError
from specdec.report import analysis, fidelity

T, D = models.read_bytes("qwen2.5-coder-1.5b/0.5b")


def _row(engine, k, proposer, speedup, base, probe, tps=np.nan, spread=0.05, batch=1):
    reps = np.random.default_rng(k + len(engine)).normal(speedup, spread, analysis.N_BOOT)
    return {"engine": engine, "run_id": f"{engine}-bs{batch}-k{k}-{proposer}", "pair": "qwen2.5-coder-1.5b/0.5b",
            "batch": batch, "k": k, "proposer": proposer, "temperature": 0.0, "quant": "none",
            "throughput_tok_s": base * speedup, "baseline_tok_s": base if k else np.nan, "speedup": speedup,
            "ci_lo": speedup - 2 * spread, "ci_hi": speedup + 2 * spread, "replicates": reps, "probe_gbs": probe,
            "tokens_per_step": tps, "same_as_base": 1.0 if engine == "vllm" and k else np.nan}


@pytest.fixture
def table(monkeypatch):
    rows = [_row("vllm", 3, "draft", 1.40, 2.2, 20.0, 3.0), _row("torch", 3, "draft", 0.70, 1.6, 16.0, 3.0),
            _row("vllm", 3, "ngram", 1.10, 2.0, 20.0, 1.5), _row("torch", 3, "ngram", 1.05, 1.9, 19.0, 1.5),
            _row("vllm", 0, "none", 1.0, 2.1, 20.0)]
    df = pd.DataFrame(rows)
    monkeypatch.setattr(fidelity, "_table", lambda gpu, study: df)
    return df


def test_engines_pairs_cells_of_both_engines(table):
    eng = fidelity.engines("cpu").set_index("proposer")
    assert list(eng.index) == ["draft", "ngram"]  # the k=0 cell was measured by one engine only
    d = eng.loc["draft"]
    assert d["base_ratio"] == pytest.approx(1.6 / 2.2)
    assert d["base_ratio_probe"] == pytest.approx((1.6 / 16.0) / (2.2 / 20.0))  # per unit of probed bandwidth
    assert d["speedup_ratio"] == pytest.approx(0.5)
    assert d["ratio_ci_lo"] < 0.5 < d["ratio_ci_hi"]
    assert d["verdict"] == "disagree" and eng.loc["ngram", "verdict"] == "agree"
    assert d["vllm_same_as_base"] == 1.0


def test_engines_needs_both_engines(monkeypatch, table):
    monkeypatch.setattr(fidelity, "_table", lambda gpu, study: (_ for _ in ()).throw(
        SpecdecError("engine fidelity needs cells of both engines")))
    with pytest.raises(SpecdecError, match="both engines"):
        fidelity.engines("cpu")


def test_roofline_bounds(table):
    roof = fidelity.roofline("cpu").set_index(["engine", "proposer"])
    v = roof.loc[("vllm", "draft")]
    assert v["base_bound_tok_s"] == pytest.approx(20.0e9 / T)  # probe GB/s over the target's streamed bytes
    assert v["base_frac"] == pytest.approx(2.2 / (20.0e9 / T))
    assert v["bound_speedup"] == pytest.approx(3.0 * T / (T + 3 * D))  # one target pass + three draft passes
    assert v["sd_frac"] == pytest.approx(1.40 / v["bound_speedup"])
    assert roof.loc[("vllm", "ngram"), "bound_speedup"] == pytest.approx(1.5)  # n-gram lookup reads no weights
    assert np.isnan(roof.loc[("vllm", "none"), "sd_frac"]) if "sd_frac" in roof else True
    # with the numbers (15 GB/s, 3.5 tokens/step) the bound is ~2.4 tok/s and ~1.78x
    assert 15e9 / T == pytest.approx(2.43, abs=0.01) and 3.5 * T / (T + 3 * D) == pytest.approx(1.79, abs=0.01)
