"""analysis.py and claims.py on the CI fixture (data/raw/fixture) and on small synthetic raw runs."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from specdec.data import rawdata
from specdec.errors import SpecdecError
from specdec.report import analysis, claims

GPU = "fixture"


@pytest.fixture(scope="module")
def sp():
    return analysis.speedup(GPU, "batch")


# -- throughput and speedup ------------------------------------------------------------------------------------
def test_speedup_cis_contain_the_point_estimate(sp):
    with_ci = sp.dropna(subset=["ci_lo", "ci_hi"])
    assert len(with_ci) == len(sp), "every fixture batch cell has >= 2 timed batches, so every CI is defined"
    assert (with_ci["ci_lo"] <= with_ci["speedup"] + 1e-12).all()
    assert (with_ci["speedup"] <= with_ci["ci_hi"] + 1e-12).all()
    assert (sp["tp_ci_lo"] <= sp["throughput_tok_s"]).all() and (sp["throughput_tok_s"] <= sp["tp_ci_hi"]).all()


def test_baseline_speedup_is_exactly_one_and_every_cell_has_one(sp):
    base = sp[sp["k"] == 0]
    assert len(base) == len(sp[["engine", "batch"]].drop_duplicates())  # one per engine and batch size
    assert (base["speedup"] == 1.0).all() and (base["ci_lo"] == 1.0).all() and (base["ci_hi"] == 1.0).all()
    assert sp["speedup"].notna().all()
    sd = sp[sp["k"] > 0]
    # the fixture is paired: each SD cell's speedup is against its own interleaved no-SD batches
    assert (sd["note"] == "paired").all() and (sd["baseline_run"] == sd["run_id"]).all()
    assert (sd["speedup"] == sd["paired_speedup"]).all()


def test_throughput_is_tokens_over_seconds():
    b = analysis.load("batch", GPU, "batches")
    tp = analysis.throughput(GPU, "batch")
    for _, r in tp.iterrows():
        g = b[(b["run_id"] == r["run_id"]) & (b["arm"] == "cell")]  # the cell's own batches, not its base arm
        assert r["throughput_tok_s"] == pytest.approx(g["decode_tokens"].sum() / g["decode_s"].sum())
        assert r["n_units"] == len(g)


def test_bootstrap_is_reproducible():
    a, b = analysis.speedup(GPU, "batch"), analysis.speedup(GPU, "batch")
    pd.testing.assert_frame_equal(a, b)


def test_single_unit_cells_get_nan_ci_not_a_fake_one():
    sp = analysis.speedup(GPU, "alternatives")
    one = sp[(sp["n_units"] < 2) & (sp["k"] > 0)]
    assert len(one) and one["ci_lo"].isna().all() and one["note"].str.contains("CI needs").all()


# -- acceptance --------------------------------------------------------------------------------------------------
def test_position_acceptance_is_a_probability():
    pos = analysis.position_acceptance(GPU, "acceptance")
    assert set(pos["proposer"]) == {"draft", "ngram"}
    assert pos["p_accept"].dropna().between(0, 1).all()
    assert (pos["accepted"] <= pos["tried"]).all()
    assert (pos["proposed"].isna() | (pos["proposed"] <= pos["tried"])).all()  # vLLM does not count proposals
    for _, g in pos.groupby(["proposer", "temperature", "prompt_set"]):
        g = g.sort_values("position")
        assert list(g["position"]) == list(range(1, len(g) + 1))
        # one definition for every proposer: position i+1 is tried exactly by the steps that accepted i
        assert (g["tried"].to_numpy()[1:] == g["accepted"].to_numpy()[:-1]).all()
    ngram = pos[pos["proposer"] == "ngram"]
    assert (ngram["proposed"] < ngram["tried"]).any(), "n-gram lookups leave positions empty: tried, rejected"


def test_request_acceptance_counts_match_the_steps():
    req = analysis.request_acceptance(GPU, "acceptance")
    req = req[req["engine"] == "torch"]  # vLLM's counters are per run, not per request
    # requests that were never proposed anything (n-gram without a match) have an undefined rate
    assert req["acceptance_rate"].isna().equals(req["proposed"] == 0)
    assert req["acceptance_rate"].dropna().between(0, 1).all()
    assert (req["accepted"] <= req["proposed"]).all()
    s = analysis.load("acceptance", GPU, "steps")
    s = s[(s["k"] > 0) & s["alpha"].isna()]
    acc = sum(int(np.sum(np.asarray(a) * np.asarray(m))) for a, m in zip(s["accepted"], s["active"]))
    assert req["accepted"].sum() == acc
    assert req["prompt_set"].ne("unknown").all(), "every step entry joins to its request"


def test_iid_formula():
    assert analysis.iid_tokens_per_step(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert analysis.iid_tokens_per_step(1.0, 4) == pytest.approx(5)
    assert analysis.iid_tokens_per_step(0.0, 4) == pytest.approx(1)


def test_iid_prediction_fits_the_synthetic_cells():
    iid = analysis.iid_prediction(GPU, "acceptance")
    synth = iid[iid["synthetic"]]
    assert len(synth) == 6
    # forced i.i.d. acceptance: the measured alpha is near the forced one and the model predicts tokens/step
    assert (synth["alpha_measured"] - synth["alpha"]).abs().max() < 0.15
    assert synth["error"].abs().max() < 0.05
    assert (iid["error"] == iid["measured_tps"] / iid["predicted_tps"] - 1).all()


# -- break-even ----------------------------------------------------------------------------------------------------
def test_crossing_interpolates_and_flags_no_crossing():
    a = np.array([0.2, 0.6, 1.0])
    assert analysis._crossing(a, np.array([0.5, 0.9, 1.3])) == pytest.approx(0.7)
    assert analysis._crossing(a, np.array([1.2, 1.5, 2.0])) == -np.inf
    assert analysis._crossing(a, np.array([0.2, 0.5, 0.9])) == np.inf
    assert analysis._crossing(a, np.array([0.8, 1.1, 0.9])) == np.inf


def test_break_even_in_unit_interval_or_nan_with_reason():
    be = analysis.break_even(GPU, "acceptance")
    assert sorted(be["batch"]) == [1, 4]
    for _, r in be.iterrows():
        if np.isnan(r["break_even"]):
            assert r["note"], "a NaN break-even needs its reason"
        else:
            assert 0 <= r["break_even"] <= 1
            if not np.isnan(r["ci_lo"]):
                assert 0 <= r["ci_lo"] <= r["ci_hi"] <= 1


# -- overheads, latency, alternatives -------------------------------------------------------------------------------
def test_draft_overhead_fractions():
    ov = analysis.draft_overhead(GPU, "batch")
    assert ov["draft_frac"].between(0, 1).all() and (ov["ci_lo"] <= ov["draft_frac"]).all()
    assert set(ov["proposer"]) == {"draft", "ngram"}
    fr = analysis.forward_ratio(GPU, "hardware")
    assert (fr["ratio"] > 0).all() and len(fr) == 12
    assert fr["ratio"].to_numpy() == pytest.approx((fr["draft_s"] / fr["target_s"]).to_numpy())


def test_latency_percentiles_are_ordered():
    lat = analysis.latency(GPU, "alternatives")
    for _, g in lat.groupby(["run_id", "metric"]):
        v = g.sort_values("quantile")["value_s"].to_numpy()
        assert (np.diff(v) >= 0).all() and (v >= 0).all()
    srv = analysis.serving_throughput(GPU, "alternatives")
    assert len(srv) == 4 and (srv["throughput_tok_s"] > 0).all()


def test_alternatives_options():
    alt = analysis.alternatives(GPU, "alternatives")
    assert {"int8", "SD", "SD+int8", "continuous batching", "continuous batching+SD"} <= set(alt["option"])
    assert (alt["speedup"] > 0).all()
    int8 = alt[alt["option"] == "int8"].iloc[0]
    tp = analysis.throughput(GPU, "alternatives")
    ref = tp[(tp["batch"] == int8["batch"]) & (tp["k"] == 0) & (tp["quant"] == "none")].iloc[0]
    assert int8["speedup"] == pytest.approx(int8["throughput_tok_s"] / ref["throughput_tok_s"])


# -- missing data ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [analysis.speedup, analysis.position_acceptance, analysis.break_even,
                                analysis.draft_overhead, analysis.forward_ratio, analysis.latency,
                                analysis.alternatives, analysis.iid_prediction])
def test_missing_study_is_a_one_line_error(fn):
    with pytest.raises(SpecdecError) as e:
        fn("no-such-profile")
    assert "\n" not in str(e.value) and "no-such-profile" in str(e.value)


def test_missing_table_names_the_table():
    with pytest.raises(SpecdecError, match="no 'steps' table"):
        analysis.load("hardware", GPU, "steps")


# -- claims on synthetic raw runs -----------------------------------------------------------------------------------
def _write_batch_runs(root, speedups: dict[int, float]):
    """Fake batch-study runs for profile 'fake': baseline 100 tok/s, SD (k=3 draft) at `speedups[batch]`."""
    for batch, s in speedups.items():
        for k, tput in ((0, 100.0), (3, 100.0 * s)):
            cell = {"mode": "static", "batch": batch, "k": k, "proposer": "draft" if k else "none",
                    "temperature": 0.0, "alpha": None, "quant": "none", "rate": None, "context": None}
            rng = np.random.default_rng(batch * 10 + k)
            secs = 1.0 + 0.01 * rng.standard_normal(4)
            batches = pd.DataFrame({"repeat": [0, 0, 1, 1], "batch_idx": [0, 1, 0, 1], "size": batch,
                                    "prefill_s": 0.1, "decode_s": secs, "steps": 10,
                                    "new_tokens": 0, "decode_tokens": tput * secs})
            run_id = f"bs{batch}-k{k}-x-00000000"
            rawdata.write_run(root / "fake" / "batch" / run_id, {"batches": batches},
                              {"run_id": run_id, "profile": "fake", "cell": cell, "config": {"pair": "p-1.5b/0.5b"},
                               "engine": "torch"})


def _verdict(df, claim):
    return df.set_index("claim").loc[claim, "verdict"]


def test_claims_follow_the_data(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path))
    _write_batch_runs(tmp_path, {1: 2.5, 16: 1.05, 64: 0.9})
    good = claims.verdicts("fake")
    assert _verdict(good, "C3") == "reproduced"
    assert good.set_index("claim").loc["C3", "measured"] == pytest.approx(2.5, rel=0.02)
    assert _verdict(good, "C4") == "reproduced" and _verdict(good, "C5") == "reproduced"
    assert _verdict(good, "C1") == "not measurable here"  # no EAGLE
    assert _verdict(good, "C6a") == "not measurable here"  # no acceptance study
    assert _verdict(good, "C8") == "not measurable here"  # no alternatives study


def test_claims_reject_what_the_data_contradicts(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path))
    _write_batch_runs(tmp_path, {1: 1.4, 16: 1.3, 64: 1.2})
    bad = claims.verdicts("fake")
    assert _verdict(bad, "C3") == "not reproduced" and "below" in bad.set_index("claim").loc["C3", "reason"]
    assert _verdict(bad, "C4") == "not reproduced"
    assert _verdict(bad, "C5") == "not reproduced"


def test_claims_on_the_fixture():
    df = claims.verdicts(GPU)
    assert list(df["claim"]) == ["C1", "C2", "C3", "C4", "C5", "C6a", "C6b", "C7", "C8", "C8s"]
    assert df["verdict"].isin(["reproduced", "not reproduced", "not measurable here"]).all()
    assert (df["reason"].str.len() > 0).all() and (df["rule"].str.len() > 0).all()
    v = df.set_index("claim")
    assert v.loc["C1", "verdict"] == "not measurable here" and "EAGLE" in v.loc["C1", "reason"]
    assert v.loc["C4", "verdict"] == "not measurable here" and "> 8" in v.loc["C4", "reason"]
    # no H100/A100 measurements: C7 falls back to the roofline priors of both profiles and says so
    assert v.loc["C7", "basis"] == "predicted" and v.loc["C7", "reason"].startswith("PREDICTED")
    # the fixture has vLLM runs: the speedup claims are decided on vLLM, with the torch engine's value beside them
    assert (v.loc[["C1", "C2", "C3", "C4", "C5"], "basis"] == "measured, vllm").all()
    assert v.loc["C3", "torch_engine"].endswith(")") and "x (95% CI" in v.loc["C3", "torch_engine"]
    assert (v.loc[["C6a", "C6b", "C7", "C8"], "torch_engine"].fillna("") == "").all()
    md = claims.to_markdown(df)
    assert len(re.findall(r"^\| C\d", md, flags=re.M)) == len(df)


def test_target_size_parsing():
    assert claims.target_billions("qwen2.5-coder-1.5b/0.5b") == 1.5
    assert claims.target_billions("llama3.1-8b/eagle") == 8
    assert claims.target_billions("tiny") is None
    assert claims._is_large("llama3-70b/8b") and not claims._is_large("llama3.1-8b/llama3.2-1b")


# -- runs without step traces (the vLLM runner's format) ------------------------------------------------------------
def _write_vllm_runs(root, study, cells):
    """cells: (batch, k, proposer, tokens/s, acceptance counters or None); requests + batches + acceptance.json."""
    import json
    for batch, k, proposer, tput, counters in cells:
        cell = {"mode": "static", "batch": batch, "k": k, "proposer": proposer, "temperature": 0.0, "alpha": None,
                "quant": "none", "rate": None, "context": None, "requests": None}
        secs = np.array([1.0, 1.02, 0.98, 1.01])
        batches = pd.DataFrame({"repeat": [0, 0, 1, 1], "batch_idx": [0, 1, 0, 1], "size": batch,
                                "prefill_s": np.nan, "decode_s": secs, "steps": np.nan, "new_tokens": 0,
                                "decode_tokens": tput * secs})
        requests = pd.DataFrame({"repeat": [0], "batch_idx": [0], "rid": [0], "prompt_set": ["humaneval"],
                                 "prompt_idx": [0], "prompt_tokens": [10], "new_tokens": [16], "arrival_s": [0.0],
                                 "admitted_s": [0.0], "first_token_s": [0.1], "finish_s": [1.0]})
        run_id = f"bs{batch}-k{k}-{proposer}-00000000"
        folder = root / "fakevllm" / study / run_id
        rawdata.write_run(folder, {"requests": requests, "batches": batches},
                          {"run_id": run_id, "profile": "fakevllm", "cell": cell,
                           "config": {"pair": "llama3.1-8b/eagle"}, "engine": "vllm"})
        if counters:
            (folder / "acceptance.json").write_text(json.dumps(counters))


def test_runs_without_steps_use_batches_and_acceptance_json(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path))
    counters = {"num_drafts": 100, "num_draft_tokens": 300, "num_accepted_tokens": 150,
                "num_accepted_tokens_per_pos": [80, 45, 25]}
    cells = [(1, 0, "none", 100.0, None), (1, 3, "eagle", 190.0, counters),
             (128, 0, "none", 1000.0, None), (128, 3, "eagle", 1500.0, counters)]
    _write_vllm_runs(tmp_path, "batch", cells)
    _write_vllm_runs(tmp_path, "acceptance", cells[:2])
    sp = analysis.speedup("fakevllm", "batch")
    assert sp.set_index(["batch", "k"]).loc[(1, 3), "speedup"] == pytest.approx(1.9)
    pos = analysis.position_acceptance("fakevllm", "acceptance")
    assert list(pos["tried"]) == [100, 80, 45] and list(pos["accepted"]) == [80, 45, 25]
    assert pos["proposed"].isna().all()  # aggregate counters do not say which positions held a token
    iid = analysis.iid_prediction("fakevllm", "acceptance")
    assert iid["measured_tps"].iloc[0] == pytest.approx(2.5)
    assert iid["alpha_measured"].iloc[0] == pytest.approx(150 / 225)
    with pytest.raises(SpecdecError, match="vLLM"):
        analysis.draft_overhead("fakevllm", "batch")
    v = claims.verdicts("fakevllm").set_index("claim")
    assert v.loc["C1", "verdict"] == "reproduced" and v.loc["C1", "measured"] == pytest.approx(1.9, rel=0.02)
    assert v.loc["C2", "verdict"] == "not reproduced"  # 1.5x vs the claimed 1.21x
    assert "H100" in v.loc["C1", "reason"]  # the profile is not an H100 one
