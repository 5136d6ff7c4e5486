"""Cost model: the fit recovers known coefficients, the prior follows the roofline, step costs add up."""
import numpy as np
import pandas as pd
import pytest

from specdec.errors import SpecdecError
from specdec.model import costmodel
from specdec.model.costmodel import CostModel, LinearCost

A, B, C = 2e-3, 5e-4, 1e-6  # s, s/token, s/KV token


def synthetic_forwards(a=A, b=B, c=C, noise=0.0, seed=0, repeats=3):
    rng = np.random.default_rng(seed)
    rows = []
    for batch in (1, 2, 4, 8, 16, 32):
        for query in (1, 2, 4, 8):
            for context in (64, 256, 1024):
                for rep in range(repeats):
                    t = a + b * batch * query + c * batch * context
                    rows.append({"model": "target", "repeat": rep, "batch": batch, "query": query,
                                 "context": context, "tokens": batch * query,
                                 "seconds": t * (1 + noise * rng.standard_normal())})
    return pd.DataFrame(rows)


def test_fit_recovers_exact_coefficients():
    fit = costmodel.fit_linear(synthetic_forwards())
    assert fit.cost.a == pytest.approx(A, rel=1e-6)
    assert fit.cost.b == pytest.approx(B, rel=1e-6)
    assert fit.cost.c == pytest.approx(C, rel=1e-6)
    assert fit.summary()["rel_rmse"] < 1e-6


def test_fit_recovers_coefficients_under_noise_and_reports_residuals():
    fit = costmodel.fit_linear(synthetic_forwards(noise=0.02, seed=3))
    assert fit.cost.a == pytest.approx(A, rel=0.1)
    assert fit.cost.b == pytest.approx(B, rel=0.05)
    assert fit.cost.c == pytest.approx(C, rel=0.1)
    s = fit.summary()
    assert s["n"] == 6 * 4 * 3  # medians of the repeats
    assert 0.002 < s["rel_rmse"] < 0.03  # the median of 3 draws of 2 % noise


def test_fit_is_non_negative():
    # time that falls with KV tokens: least squares would make c negative
    df = synthetic_forwards(c=0.0)
    df["seconds"] -= 1e-7 * df["batch"] * df["context"] * (df["seconds"] > 0.01)
    fit = costmodel.fit_linear(df)
    assert min(fit.cost.a, fit.cost.b, fit.cost.c) >= 0


def test_free_step_form_fits_a_one_token_forward_dearer_than_a_longer_one():
    """fit_linear(free_step=True): a one-token forward and a longer one get their own intercepts, so the step d
    may be negative (recovered exactly); the default form keeps d >= 0 and misses; on a world with d >= 0
    both forms agree."""
    df = synthetic_forwards()
    df["seconds"] -= 1e-3 * (df["tokens"] > 1)  # a one-token forward 1 ms dearer than the line through the rest
    free, step = costmodel.fit_linear(df, free_step=True), costmodel.fit_linear(df)
    assert free.cost.a == pytest.approx(A, rel=1e-6) and free.cost.d == pytest.approx(-1e-3, rel=1e-6)
    assert free.summary()["rel_rmse"] < 1e-6 and step.cost.d >= 0 and step.summary()["rel_rmse"] > 0.01
    assert free.free_step and not step.free_step
    plain = costmodel.fit_linear(synthetic_forwards(), free_step=True)
    assert plain.cost.d == pytest.approx(0, abs=1e-9) and plain.cost.a == pytest.approx(A, rel=1e-6)


def test_fit_needs_three_points():
    df = synthetic_forwards()
    with pytest.raises(SpecdecError):
        costmodel.fit_linear(df[(df["batch"] == 1) & (df["context"] == 64) & (df["query"] <= 2)])


def test_step_cost_adds_draft_and_verify_forwards():
    t, d = LinearCost(1e-3, 1e-4, 1e-7), LinearCost(3e-4, 2e-5, 1e-8)
    cm = CostModel("fixture", "tiny", "fitted", t, d, overhead_s=5e-5)
    b, ctx = 8, 300
    assert cm.step_s(b, 0, ctx) == pytest.approx(t.seconds(b, 1, ctx) + 5e-5)
    expect = d.seconds(b, 2, ctx) + 3 * d.seconds(b, 1, ctx) + t.seconds(b, 5, ctx) + 5e-5
    assert cm.step_s(b, 4, ctx) == pytest.approx(expect)
    assert cm.step_s(b, 4, ctx, proposer="ngram") == pytest.approx(t.seconds(b, 5, ctx) + 5e-5)


def test_fixture_fit_is_labelled_fitted_with_residuals():
    cm = costmodel.load("fixture", "tiny-vllm")
    assert cm.source == "fitted" and cm.pair == "tiny-vllm"
    assert set(cm.residuals()) == {"target", "draft"}
    assert "FITTED" in cm.describe()
    assert cm.forward_s("target", 4, 1, 100) > 0


def test_prior_follows_roofline_and_is_labelled():
    cm = costmodel.load("h100", "qwen2.5-coder-1.5b/0.5b")
    assert cm.source == "prior" and "PRIOR" in cm.describe()
    eff_m, eff_f, over = costmodel.PRIOR_EFF_MEM[0], costmodel.PRIOR_EFF_FLOPS[0], costmodel.PRIOR_OVERHEAD_S[0]
    # batch 1, short context: memory bound, reads the bf16 weights once
    weights, kv = 1.54e9 * 2, 2 * 28 * 2 * 128 * 2  # bf16 bytes: parameters, K+V of one token
    assert cm.forward_s("target", 1, 1, 1) == pytest.approx(over + (weights + kv) / (eff_m * 3.35e12))
    # 8192 tokens at tiny context: compute bound
    flops = 2 * 1.54e9 * 8192 + 4 * 28 * 1536 * 8192 * 1
    assert cm.forward_s("target", 8192, 1, 1) == pytest.approx(over + flops / (eff_f * 989e12))
    assert cm.forward_s("draft", 1, 1, 1) < cm.forward_s("target", 1, 1, 1)


def test_prior_needs_a_spec_sheet_and_known_sizes():
    with pytest.raises(SpecdecError, match="spec sheet"):
        costmodel.prior("cpu", "tiny")
    with pytest.raises(SpecdecError, match="unknown model pair"):
        costmodel.prior("h100", "no-such-pair")
    with pytest.raises(SpecdecError, match="unknown hardware profile"):
        costmodel.load("no-such-gpu", "tiny")


def test_resample_fitted_without_residuals_is_stable_and_prior_varies_in_range():
    fits = {"target": costmodel.fit_linear(synthetic_forwards()),
            "draft": costmodel.fit_linear(synthetic_forwards(a=A / 4, b=B / 4, c=C / 4))}
    cm = CostModel("fixture", "tiny", "fitted", fits["target"].cost, fits["draft"].cost, fits)
    again = cm.resample(np.random.default_rng(0))
    assert again.target.b == pytest.approx(cm.target.b, rel=1e-6)
    pr = costmodel.prior("h100", "llama3.1-8b/llama3.2-1b")
    draws = [pr.resample(np.random.default_rng(s)).target.eff_mem for s in range(20)]
    lo, hi = costmodel.PRIOR_EFF_MEM[1]
    assert all(lo <= e <= hi for e in draws) and np.std(draws) > 0


def test_attention_term_is_recovered_and_wins_cross_validation():
    """Forwards whose cost has an attention part (new tokens x context) are fitted by the e term, and the
    leave-one-out error says the form without it misfits; on data without that part the term stays ~0."""
    from specdec.model.costmodel import LinearCost, fit_linear, loo_rel_rmse

    rows = [{"batch": b, "query": q, "context": c} for b in (1, 4, 16, 64) for q in (1, 2, 4, 7) for c in (128, 512)]
    grid = pd.DataFrame(rows)
    truth = LinearCost(0.2, 2e-3, 3e-6, 0.0, 6e-6)
    with_attn = grid.assign(seconds=truth.seconds(grid["batch"], grid["query"], grid["context"]))
    f = fit_linear(with_attn)
    assert f.cost.e == pytest.approx(truth.e, rel=1e-3) and f.summary()["rel_rmse"] < 1e-6
    assert loo_rel_rmse(f.points, 4) > 0.1 > loo_rel_rmse(f.points, 5)
    plain = LinearCost(0.2, 2e-3, 3e-6)
    without = grid.assign(seconds=plain.seconds(grid["batch"], grid["query"], grid["context"]))
    assert fit_linear(without).cost.e == pytest.approx(0.0, abs=1e-12)
