"""End-to-end calibration of the published H100 fit on measured speedups (issue 12 item 2)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specdec.data import traces as tr
from specdec.model import calibrate, costmodel
from specdec.report import views

NAME = "llama3.1-8b-h100"


@pytest.fixture(scope="module")
def costs():
    return costmodel.load("h100", tr.source(NAME)["pair"])


def _grid(datasets=("cnn", "sharegpt")):
    return pd.DataFrame([{"dataset": d, "proposer": p, "batch": b, "k": 3, "speedup": 1.0}
                         for d in datasets for p in ("eagle", "ngram") for b in (1, 16, 64, 128)])


def test_apply_scales_exactly_its_terms(costs):
    c = calibrate.apply(costs, {"verify": 0.5, "draft": 2.0, "overhead": 3.0, "prefill": 4.0})
    assert c.target.b == costs.target.b * 0.5 and c.target.c == costs.target.c and c.target.a == costs.target.a
    assert c.draft.fixed_s == costs.draft.fixed_s * 2 and c.overhead_s == costs.overhead_s * 3
    assert c.prefill_scale == 4.0 and c.ngram_fraction == costs.ngram_fraction
    same = calibrate.apply(costs, {})
    cell = calibrate.cells(NAME, _grid())[0]
    assert cell.predict(same) == cell.predict(costs)


def test_a_planted_correction_is_found_and_predicts_series_it_never_saw(costs):
    truth = calibrate.apply(costs, {"verify": 0.6})
    cells = calibrate.cells(NAME, _grid())
    planted = [calibrate.Cell(**{**c.__dict__, "measured": c.predict(truth)}) for c in cells]
    cal = calibrate.calibrate(costs, planted)
    assert "verify" in cal.terms and cal.theta["verify"] == pytest.approx(0.6, rel=0.02)
    chosen = cal.candidates[cal.candidates["chosen"]].iloc[0]
    assert chosen["cv_mape"] < 0.5 < cal.candidates.loc[cal.candidates["terms"] == "(none)", "cv_mape"].iloc[0]
    assert len(cal.cv_predictions) == len(planted)


def test_no_term_is_kept_when_none_generalises(costs):
    cells = calibrate.cells(NAME, _grid())
    rng = np.random.default_rng(0)  # independent 5% errors: nothing shared across series to learn
    noisy = [calibrate.Cell(**{**c.__dict__, "measured": c.predict(costs) * (1 + 0.05 * rng.standard_normal())})
             for c in cells]
    cal = calibrate.calibrate(costs, noisy)
    assert cal.terms == () and cal.theta == {}


def test_held_out_datasets_never_enter_the_calibration():
    cells = calibrate.cells(NAME, _grid(("cnn", "gsm8k", "instructcoder", "sharegpt")))
    assert {c.dataset for c in cells} == {"cnn", "sharegpt"}
    assert {c.dataset for c in calibrate.cells(NAME, _grid(("cnn", "gsm8k")), held_out=True)} == {"gsm8k"}


def test_the_paper_table_carries_the_calibrated_column():
    df = views.paper_measured()
    assert {"calibrated_cv", "abs_pct_err_calibrated_cv"} <= set(df.columns)
    assert np.isfinite(df["calibrated_cv"]).all() and set(df["dataset"]) == {"cnn", "sharegpt"}
    cand = views.calibration_candidates()
    assert cand["chosen"].sum() == 1 and (cand["cv_mape"] >= 0).all()


def test_costs_fitted_end_to_end_on_calibration_cells_and_validated_on_the_rest():
    """Issue 12 item 2, CPU: the cost model from the batch study's own steps (no-SD batches + named calibration
    cells); those cells never count as validation cells; the config hash ignores the list."""
    from specdec.data import config, tables
    from specdec.report import advise
    cal = config.analysis_settings("batch", "cpu")["calibration"]
    assert cal and config.analysis_settings("batch", "h100")["calibration"] == ()
    costs = costmodel.fit_steps("cpu", cal)
    assert costs.source == "steps" and "calibration cell" in costs.describe()
    # the fitted 1-token step at bs 1 is the measured no-SD step there (seconds per step of the base arms), within
    # 20%: one linear fit over bs 1-64 holds bs 1 low (2026-12-07: 0.214 s against 0.255 s; 0.217 s before the
    # n-gram calibration cells were fitted at the widths they verified; README, goal G3)
    b = tables.load("cpu", "batch", "batches")
    b = b[(b["engine"] == "torch") & (b["arm"] == "base") & (b["size"] == 1)]
    measured = float((b["decode_s"] / b["steps"]).median())
    pts = costs.fits["target"].points
    at1 = pts[(pts["batch"] == 1) & (pts["query"] == 1)]
    assert float(np.median(at1["fitted_s"])) == pytest.approx(measured, rel=0.2)
    val = advise.validate("cpu")
    assert not any(costmodel.matches(r, cal) for r in val["run_id"]) and len(val) >= 5
    assert np.isfinite(val.attrs["mape"]) and val.attrs["cost_source"].startswith("FITTED END TO END")
    cfg = config.load_study("batch", "cpu")
    assert config.config_hash(cfg) == config.config_hash({k: v for k, v in cfg.items() if k != "calibration"})
    with pytest.raises(Exception, match="no draft-model calibration cell"):
        costmodel.fit_steps("cpu", ["no-such-cell-*"])


def test_validation_intervals_resample_costs_and_acceptance():
    """Issue 12 item 3: the interval advise would give, checked against held-out cells (goal G14)."""
    from specdec.report import advise
    v = advise.validate("cpu", n_boot=20)
    assert (v["pred_lo"] <= v["pred_hi"]).all() and (v["pred_hi"] > v["pred_lo"]).any()
    assert 0 <= v.attrs["coverage"] <= 1
    assert v.attrs["coverage"] == pytest.approx(v["covered"].mean())
    assert 0 <= v.attrs["coverage_model"] <= 1 and (v["model_lo"] <= v["model_hi"]).all()
    if v.attrs["run_log_sd"] > 0:  # the fixture's paired calibration cells: a cell's noise widens the intervals
        wider = (v["pred_hi"] / v["pred_lo"]) >= (v["model_hi"] / v["model_lo"])
        assert wider.mean() > 0.5 and np.log(v["pred_hi"] / v["pred_lo"]).median() > \
            np.log(v["model_hi"] / v["model_lo"]).median()
    else:
        assert (v["pred_lo"] == v["model_lo"]).all() and (v["pred_hi"] == v["model_hi"]).all()
    assert "pred_lo" not in advise.validate("cpu")  # n_boot=0: no interval, no cost


def _step_tables(slow: dict | None = None, drift: dict | None = None, ngram: str | None = None,
                 jump: float | None = None):
    """Synthetic batch-study tables whose step times follow a known linear cost exactly (target
    1e-3 + 1e-4*tokens + 1e-7*kv_tokens s, draft 2e-4 + 1e-8*kv_tokens s per proposed token,
    independent of tokens: the model's first draft forward carries 2 tokens): k=0 cells at bs 1, 4,
    16 and paired draft-model SD cells at bs 1, 4, 16 with k 2 and 3; `slow` = {run_id: factor} plants a
    structural error: that cell's SD steps take factor times the model's seconds; `drift` = {run_id: factor}
    plants a slow moment of the machine: both arms of that paired cell take factor times the model's seconds.
    `ngram` (a verify rule) adds paired n-gram cells at k=3, bs 1 and 16, whose lookups propose 0-3 tokens, their
    steps verifying 1 + each proposal (runs' verify: `ngram`), the target then also paying 5e-4 s for any forward
    of more than one token; `jump` sets that step instead (negative: a one-token forward is the dearer one)."""
    jump = jump if jump is not None else 5e-4 if ngram else 0.0
    tgt = lambda tokens, kv: 1e-3 + 1e-4 * tokens + 1e-7 * kv + jump * (tokens > 1)
    dft = lambda tokens, kv: 2e-4 + 1e-8 * kv
    b, st, rq = [], [], []
    cells = [(bs, 0) for bs in (1, 4, 16)] + [(bs, k) for bs in (1, 4, 16) for k in (2, 3)]
    for bs in ((1, 16) if ngram else ()):
        rid = f"bs{bs}-k3-ngram-t0-test"
        for bi, width in enumerate((40, 80, 120)):
            ctx = width + 8 / 2
            common = {"run_id": rid, "repeat": 0, "batch_idx": bi, "k": 3, "batch": bs, "size": bs,
                      "proposer": "ngram", "engine": "torch", "pair": "p"}
            rq += [{**common, "prompt_tokens": width, "new_tokens": 8} for _ in range(bs)]
            total = 0.0
            for i in range(4):
                prop = [(i + j + bi) % 4 for j in range(bs)] if bs > 1 else [(0, 3, 0, 2)[i]]
                verify = tgt(bs + sum(prop), bs * ctx)
                st.append({**common, "step": i, "verify_s": verify, "other_s": 0.0, "draft_s": 0.01 * verify,
                           "proposed": prop})
                total += 1.01 * verify
            b.append({**common, "arm": "cell", "steps": 4, "decode_s": total, "decode_tokens": 8 * bs})
            b.append({**common, "arm": "base", "k": 0, "steps": 8, "decode_s": 8 * tgt(bs, bs * ctx),
                      "decode_tokens": 8 * bs})
    for bs, k in cells:
        rid = f"bs{bs}-k{k}-{'draft' if k else 'none'}-t0-test"
        m = (drift or {}).get(rid, 1.0)
        f = (slow or {}).get(rid, 1.0) * m
        for bi, width in enumerate((40, 80, 120)):
            ctx = width + 8 / 2
            common = {"run_id": rid, "repeat": 0, "batch_idx": bi, "k": k, "batch": bs, "size": bs,
                      "proposer": "draft" if k else "none", "engine": "torch", "pair": "p"}
            rq += [{**common, "prompt_tokens": width, "new_tokens": 8} for _ in range(bs)]
            base_s = tgt(bs, bs * ctx) * m
            if k:
                verify, draft = tgt(bs * (k + 1), bs * ctx) * f, k * dft(bs, bs * ctx) * f
                st += [{**common, "step": i, "verify_s": verify, "other_s": 0.0, "draft_s": draft} for i in range(3)]
                b.append({**common, "arm": "cell", "steps": 3, "decode_s": 3 * (verify + draft), "decode_tokens": 8 * bs})
                b.append({**common, "arm": "base", "k": 0, "steps": 8, "decode_s": 8 * base_s, "decode_tokens": 8 * bs})
            else:
                b.append({**common, "arm": "cell", "steps": 8, "decode_s": 8 * base_s, "decode_tokens": 8 * bs})
    st = pd.DataFrame(st)
    if "proposed" not in st:
        st["proposed"] = [[k] * bs for k, bs in zip(st["k"], st["batch"])]
    st["proposed"] = [p if isinstance(p, list) else [k] * bs for p, k, bs in zip(st["proposed"], st["k"], st["batch"])]
    runs = pd.DataFrame({"run_id": sorted(set(x["run_id"] for x in b))}).assign(verify=ngram or "k")
    return {"batches": pd.DataFrame(b), "steps": st, "requests": pd.DataFrame(rq), "runs": runs}


def test_ngram_calibration_cells_are_fitted_at_the_widths_their_steps_verified(monkeypatch):
    """An n-gram lookup proposes 0..k tokens and a ragged verify multiplies 1 + each proposal: fitted at those widths
    (at bs 1 one point per width, as a 1-token step skips the multi-row cost), an exact world is fitted exactly and
    each left-out cell predicted exactly; priced as if every step verified k+1 tokens, it is not."""
    cal = ["bs*-k*-*"]
    t = _step_tables(ngram="ragged")
    monkeypatch.setattr(costmodel.tables, "load", lambda profile, study, table: t[table])
    costs = costmodel.fit_steps("cpu", cal)
    assert costs.fits["target"].summary()["rel_rmse"] < 1e-6 and costs.cv_n == 8
    assert costs.cv_log_err == pytest.approx(0, abs=1e-6)
    assert costs.ngram_fraction == pytest.approx(0.01)
    w = costmodel.step_widths(t["steps"], dict(zip(t["runs"]["run_id"], t["runs"]["verify"])))
    one = t["steps"]["run_id"] == "bs1-k3-ngram-t0-test"
    assert sorted(set(w[one])) == [1.0, 3.0, 4.0] and (w[t["steps"]["proposer"] == "draft"] ==
                                                       t["steps"]["k"][t["steps"]["proposer"] == "draft"] + 1).all()
    padded = t | {"runs": t["runs"].assign(verify="k")}
    monkeypatch.setattr(costmodel.tables, "load", lambda profile, study, table: padded[table])
    wrong = costmodel.fit_steps("cpu", cal)
    assert wrong.fits["target"].summary()["rel_rmse"] > 0.02 and wrong.cv_log_err > 0.01


def test_step_widths_follow_each_runs_verify_rule():
    st = pd.DataFrame({"run_id": ["a", "b", "c", "c", "d"], "k": [3, 3, 3, 0, 3],
                       "proposed": [[0, 3], [0, 2], [0, 2], [0, 0], [1, 1]]})
    w = costmodel.step_widths(st, {"a": "k", "b": "proposed", "c": "ragged"})
    assert list(w) == [4.0, 3.0, 2.0, 1.0, 4.0]  # "d": no rule known, padded to k+1


def test_measured_widths_are_each_runs_mean_of_its_sd_steps():
    """validate shows a run's measured width: the mean of its SD steps' widths under its rule (torch engine
    rows only; k=0 steps and other engines' rows left out), vLLM's from its counters."""
    st = pd.DataFrame({"run_id": ["c", "c", "c", "a", "v"], "engine": ["torch"] * 4 + ["vllm"],
                       "k": [3, 3, 0, 3, 3], "proposed": [[0, 2], [3, 1], [0, 0], [1, 1], [3, 3]]})
    runs = pd.DataFrame({"run_id": ["a", "c", "v"], "verify": ["k", "ragged", "k"],
                         "drafts": [np.nan, np.nan, 10.0], "drafted_tokens": [np.nan, np.nan, 30.0],
                         "accepted_tokens": [np.nan, np.nan, 5.0]})
    b = pd.DataFrame({"run_id": ["v", "v"], "arm": ["cell", "base"], "k": [3, 0], "decode_tokens": [25, 50]})
    assert costmodel.measured_widths(st, b, runs, "torch") == pytest.approx({"c": (2.0 + 3.0) / 2, "a": 4.0})
    assert costmodel.measured_widths(None, b, runs, "vllm") == pytest.approx({"v": 1 + 30 / 20})
    assert costmodel.measured_widths(st[st["k"] == 0], b, runs, "torch") == {}


def test_vllm_verify_width_from_its_counters():
    """vLLM verifies each request's own draft: 1 + drafted tokens per request-step, a request-step emitting 1 + its
    accepted tokens (numbers of a real bs-1 k=3 n-gram cell: 474 drafted, 75 accepted, 378 decode tokens)."""
    b = pd.DataFrame({"run_id": ["r", "r", "r"], "arm": ["cell", "cell", "base"], "k": [3, 3, 0],
                      "decode_tokens": [189, 189, 378]})
    runs = pd.DataFrame({"run_id": ["r", "s"], "drafts": [158.0, np.nan], "drafted_tokens": [474.0, np.nan],
                         "accepted_tokens": [75.0, np.nan]})
    assert costmodel.vllm_widths(b, runs) == pytest.approx({"r": 1 + 474 / (378 - 75)})
    # a draft model proposes at every request-step: drafts count them where dropped accepted tokens would not
    # (a real bs-1 k=6 draft cell: 7.72 from decode - accepted)
    b = b.assign(decode_tokens=[189, 189, 378])
    runs = pd.DataFrame({"run_id": ["r"], "drafts": [60.0], "drafted_tokens": [360.0], "accepted_tokens": [325.0]})
    assert costmodel.vllm_widths(b, runs) == pytest.approx({"r": 7.0})


def test_cross_validated_structural_error_recovers_a_planted_one(monkeypatch):
    """Issue 12 item 3 (a diagnostic): fit_steps leaves each calibration cell out in turn; an exact model has no structural error,
    and a cell planted 1.3x slower than the model is predicted, when left out, with log error log(1.3)."""
    cal = ["bs*-k*-draft-*"]
    for slow, check in ((None, 0.0), ({"bs4-k3-draft-t0-test": 1.3}, np.log(1.3))):
        t = _step_tables(slow)
        monkeypatch.setattr(costmodel.tables, "load", lambda profile, study, table, t=t: t[table])
        costs = costmodel.fit_steps("cpu", cal)
        assert costs.cv_n == 6
        err = costmodel._left_out_error("cpu", cal, "p", t["batches"], t["steps"], t["requests"],
                                        "bs4-k3-draft-t0-test")
        assert err == pytest.approx(check, abs=1e-6)
        if slow is None:
            assert costs.cv_log_err == pytest.approx(0, abs=1e-6)
        else:
            assert costs.cv_log_err >= np.log(1.3) / np.sqrt(6) and "6 left-out" in costs.describe()
    assert costmodel.fit_steps("cpu", cal, cross_validate=False).cv_n == 0


def test_a_calibration_cell_measured_in_a_slow_moment_is_scaled_by_its_own_no_sd_arm(monkeypatch):
    """Issue 17 (the machine drifts): a paired calibration cell whose two arms both ran 1.6x slow bends an
    unscaled fit; scaled by its own no-SD arm it fits like the rest. fit_steps picks the scaling by
    cross-validation and says so; a machine that did not drift keeps the unscaled fit."""
    cal = ["bs*-k*-draft-*"]
    t = _step_tables(drift={"bs4-k3-draft-t0-test": 1.6, "bs16-k2-draft-t0-test": 1.6})
    monkeypatch.setattr(costmodel.tables, "load", lambda profile, study, table: t[table])
    plain = costmodel.fit_steps("cpu", cal, drift=False)
    scaled = costmodel.fit_steps("cpu", cal, drift=True)
    assert scaled.cv_log_err < plain.cv_log_err / 2 and plain.cv_log_err > 0.05
    assert scaled.fits["target"].summary()["rel_rmse"] < plain.fits["target"].summary()["rel_rmse"]
    chosen = costmodel.fit_steps("cpu", cal)
    assert chosen.cv_log_err == pytest.approx(scaled.cv_log_err) and "scaled by their no-SD arm" in chosen.provenance
    quiet = _step_tables()
    monkeypatch.setattr(costmodel.tables, "load", lambda profile, study, table: quiet[table])
    kept = costmodel.fit_steps("cpu", cal)
    assert kept.cv_log_err == pytest.approx(0, abs=1e-6) and "scaled by" not in kept.provenance
    assert "one-token step free" not in kept.provenance and kept.target.d == pytest.approx(0, abs=1e-9)


def test_a_one_token_forward_dearer_than_a_longer_one_is_fitted_when_its_points_ask(monkeypatch):
    """On the cpu profile both engines' no-SD steps cost less at bs 4 than at bs 1. A world where any forward of
    more than one token saves 4e-4 s: the step >= 0 form cannot fit it (bs-1 steps off, left-out cells mispredicted);
    fit_steps tries the free one-token step, which fits it exactly, keeps it by the target fit's
    leave-one-point-out error and says so; where the step is >= 0 (the drift test's quiet world) it is not taken."""
    cal = ["bs*-k*-draft-*"]
    t = _step_tables(jump=-4e-4)
    monkeypatch.setattr(costmodel.tables, "load", lambda profile, study, table: t[table])
    step = costmodel.fit_steps("cpu", cal, free_step=False)
    free = costmodel.fit_steps("cpu", cal, free_step=True)
    chosen = costmodel.fit_steps("cpu", cal)
    assert step.fits["target"].summary()["rel_rmse"] > 0.02 and step.cv_log_err > 0.01
    assert free.fits["target"].summary()["rel_rmse"] < 1e-6 and free.cv_log_err == pytest.approx(0, abs=1e-6)
    assert free.target.d == pytest.approx(-4e-4, rel=1e-6) and free.target.a == pytest.approx(1e-3, rel=1e-6)
    assert chosen.target == free.target and "one-token step free" in chosen.provenance


def test_vllm_decode_steps_and_step_split_from_its_per_call_figures():
    """vLLM writes no steps table: decode steps per call come from its engine steps less the paired no-SD call's
    prefill steps, and the SD step splits in the call's draft/verify proportions (numbers of a real bs-1 k=2 pair)."""
    b = pd.DataFrame([
        {"run_id": "r", "repeat": 0, "batch_idx": 0, "arm": "cell", "k": 2, "proposer": "draft", "batch": 1,
         "size": 1, "decode_s": 8.33, "steps": np.nan, "decode_tokens": 63, "step_s": 10.96, "verify_s": 5.97,
         "draft_s": 4.28, "pair": "p", "other_s": 0.71, "engine_steps": 27},
        {"run_id": "r", "repeat": 0, "batch_idx": 0, "arm": "base", "k": 2, "proposer": "draft", "batch": 1,
         "size": 1, "decode_s": 14.11, "steps": np.nan, "decode_tokens": 63, "step_s": 15.96, "verify_s": 14.06,
         "draft_s": 0.0, "pair": "p", "other_s": 1.90, "engine_steps": 64},
        {"run_id": "u", "repeat": 0, "batch_idx": 0, "arm": "cell", "k": 3, "proposer": "draft", "batch": 1,
         "size": 1, "decode_s": 8.0, "steps": np.nan, "decode_tokens": 63, "step_s": 9.0, "verify_s": 5.0,
         "draft_s": 4.0, "pair": "p", "other_s": 0.0, "engine_steps": 20}])
    out = costmodel.decode_steps(b)
    assert list(out["steps"][:2]) == [26, 63] and np.isnan(out["steps"][2])  # the unpaired call: no prefill count
    assert b["steps"].isna().all()  # the input is not changed
    rows = costmodel.vllm_step_rows(out)
    assert list(rows["run_id"]) == ["r"] and list(rows["pair"]) == ["p"]
    r = rows.iloc[0]
    assert r["draft_s"] + r["verify_s"] + r["other_s"] == pytest.approx(8.33 / 26)
    assert r["draft_s"] / (r["draft_s"] + r["verify_s"]) == pytest.approx(4.28 / 10.96)
