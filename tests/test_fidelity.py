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


def _positions(engine, accepted, tried, temperature=0.0, proposed=None):
    proposed = proposed or tried
    return [{"engine": engine, "batch": 4, "k": len(accepted), "proposer": "draft", "temperature": temperature,
             "prompt_set": s, "position": i + 1, "tried": t // 2, "accepted": a // 2,
             "proposed": p // 2 if engine == "torch" else np.nan}
            for s in ("code", "prose") for i, (a, t, p) in enumerate(zip(accepted, tried, proposed))]


def test_acceptance_compares_each_position_and_goal_flags_a_difference(monkeypatch):
    from specdec.report import goals
    # the torch engine's position 1 was tried by 120 steps, 100 of which proposed a token (vLLM counts those)
    rows = (_positions("torch", [80, 60, 40], [120, 80, 60], proposed=[100, 80, 60])
            + _positions("vllm", [80, 50, 30], [100, 80, 50])
            + _positions("vllm", [10, 2, 0], [100, 10, 2], temperature=1.0))  # sampled: one engine only
    monkeypatch.setattr(analysis, "position_acceptance", lambda profile, study="acceptance": pd.DataFrame(rows))
    acc = fidelity.acceptance("cpu").set_index("position")
    assert list(acc.index) == [1, 2, 3] and (acc["temperature"] == 0).all()  # prompt sets summed, t1 unmatched
    assert acc.loc[1, "diff"] == 0 and acc.loc[1, "torch_tried"] == 100
    assert acc.loc[2, "vllm_p"] == pytest.approx(50 / 80)
    assert acc.loc[2, "diff"] == pytest.approx(50 / 80 - 60 / 80) and acc.loc[3, "torch_tried"] == 60
    row = goals.engine_acceptance("cpu")[0]
    assert row["goal"] == "G12e" and row["met"] == "no" and "0.125" in row["value"]  # position 2
    monkeypatch.setattr(analysis, "position_acceptance",
                        lambda profile, study="acceptance": pd.DataFrame(_positions("torch", [8], [10])))
    with pytest.raises(SpecdecError, match="both engines"):
        fidelity.acceptance("cpu")
    assert goals.engine_acceptance("cpu")[0]["met"] == "not evaluated"


def test_shipped_fixture_greedy_acceptance_is_the_same_in_both_engines():
    """The fixture's acceptance study ships both engines' runs of the tiny pair (same prompts): greedy counts match
    position by position (the n-gram cell's steps without a match counted as vLLM does: not as drafts); the
    sampled cells exist for both engines too."""
    acc = fidelity.acceptance("fixture")
    greedy = acc[acc["temperature"] == 0]
    assert set(greedy["proposer"]) == {"draft", "ngram"}
    assert (greedy.loc[greedy["position"] == 1, "torch_tried"] > 0).all()
    for what in ("tried", "accepted"):  # same counts at every position, n-gram steps without a match aside
        assert (greedy[f"vllm_{what}"] == greedy[f"torch_{what}"]).all()
    assert (acc["temperature"] > 0).any()
