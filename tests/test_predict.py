"""Acceptance model, speedup predictor, policy, the advise CLI and validate()."""
import json

import numpy as np
import pandas as pd
import pytest

from specdec import cli
from specdec.data import rawdata
from specdec.errors import SpecdecError
from specdec.model import acceptance, costmodel, predict
from specdec.model.acceptance import AcceptanceModel, Trace
from specdec.model.costmodel import CostModel, LinearCost
from specdec.report import advise

TARGET = LinearCost(2e-3, 5e-5, 1e-7)


def costs(draft=LinearCost(1e-4, 2.5e-6, 5e-9), target=TARGET, source="fitted"):
    return CostModel("fixture", "tiny", source, target, draft)


def iid_traces(alpha, k, n_req=200, steps=20, seed=0):
    rng = np.random.default_rng(seed)
    ok = rng.random((n_req, steps, k)) < alpha
    n = ok.cumprod(axis=2).sum(axis=2)
    return [Trace(k, tuple(int(x) for x in row)) for row in n]


# -- acceptance ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 1.0])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_iid_special_case_matches_closed_form(alpha, k):
    acc = AcceptanceModel.iid(alpha, 8)
    closed = (k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    assert acc.expected_tokens(k) == pytest.approx(closed)
    assert acceptance.iid_expected_tokens(alpha, k) == pytest.approx(closed)
    assert acc.length_dist(k).sum() == pytest.approx(1)


def test_iid_traces_estimate_the_closed_form():
    acc = AcceptanceModel.from_traces(iid_traces(0.6, 6))
    assert acc.iid_alpha == pytest.approx(0.6, abs=0.02)
    assert np.allclose(acc.conditionals(), 0.6, atol=0.06)
    for k in (1, 3, 6):
        assert acc.expected_tokens(k) == pytest.approx(acceptance.iid_expected_tokens(0.6, k), rel=0.03)


def test_per_position_conditionals_by_hand():
    acc = AcceptanceModel.from_traces([Trace(3, (0, 1)), Trace(3, (3, 3))])
    # position 1 tried 4 accepted 3; position 2 tried 3 accepted 2; position 3 tried 2 accepted 2
    assert acc.conditionals() == pytest.approx([3 / 4, 2 / 3, 1.0])
    assert acc.length_dist(3) == pytest.approx([0.25, 0.25, 0.0, 0.5])
    assert acc.empirical_length_dist(3) == pytest.approx([0.25, 0.25, 0.0, 0.5])
    assert acc.expected_tokens(3) == pytest.approx(np.mean([1, 2, 4, 4]))
    # k' < k: the mean of min(n, k') + 1, not the i.i.d. value
    assert acc.expected_tokens(1) == pytest.approx(np.mean([1, 2, 2, 2]))
    assert acc.iid_alpha == pytest.approx(7 / 9)
    assert acc.iid_expected_tokens(3) != pytest.approx(acc.expected_tokens(3), rel=1e-3)


def test_position_dependent_acceptance_differs_from_iid():
    # the first token is hard (50 %), later ones always accepted
    acc = AcceptanceModel.from_traces([Trace(4, (0, 4) * 50)])
    assert acc.conditionals() == pytest.approx([0.5, 1, 1, 1])
    assert acc.expected_tokens(4) == pytest.approx(3.0)
    assert acc.iid_alpha == pytest.approx(0.8)  # 200 accepted of 250 tried
    assert acc.iid_expected_tokens(4) == pytest.approx(3.3616)  # i.i.d. overestimates here


def test_beyond_traced_k_is_an_error_unless_extrapolated():
    acc = AcceptanceModel.from_traces([Trace(2, (2, 1, 0))])
    with pytest.raises(SpecdecError, match="k <= 2"):
        acc.expected_tokens(4)
    assert acc.conditionals(4, extrapolate=True)[2:] == pytest.approx([acc.conditionals()[-1]] * 2)


def test_from_steps_groups_requests_and_skips_finished_and_k0():
    steps = pd.DataFrame({
        "run_id": ["r", "r", "r", "z"], "repeat": [0] * 4, "batch_idx": [0] * 4, "k": [3, 3, 3, 0],
        "accepted": [[3, 0], [1, 2], [0, 3], [0]], "proposed": [[3, 3], [3, 2], [3, 3], [0]],
        "active": [[True, True], [True, True], [False, True], [True]], "rids": [[0, 1], [0, 1], [0, 1], [0]]})
    traces = sorted(acceptance.from_steps(steps), key=lambda t: t.accepted)
    assert traces == [Trace(3, (0, 2, 3), (3, 2, 3)), Trace(3, (3, 1), (3, 3))]


def test_proposal_lengths_give_the_verify_width_by_hand():
    """An n-gram lookup proposes 0..k tokens: the mean verify width at k' is 1 + E[min(proposal, k')] (ragged), k'+1
    (padded to k) or 1 + E[the longest of the batch's proposals] (padded to it), counted by hand here."""
    acc = AcceptanceModel.from_traces([Trace(3, (0, 1, 0, 3), (0, 3, 2, 3))])
    assert acc.proposal_survival(3) == pytest.approx([0.75, 0.75, 0.5])
    assert acc.mean_proposed(3) == pytest.approx(np.mean([0, 3, 2, 3]))
    assert acc.mean_proposed(2) == pytest.approx(np.mean([0, 2, 2, 2]))
    assert acc.verify_width(3, rule="ragged") == pytest.approx(3.0)
    assert acc.verify_width(3, batch=16, rule="k") == 4.0 and acc.verify_width(0) == 1.0
    # two sequences: E[max] = P(max >= 1) + P(max >= 2) + P(max >= 3), each 1 - P(both below)
    assert acc.verify_width(3, batch=2, rule="proposed") == pytest.approx(1 + 2 * (1 - 0.25 ** 2) + (1 - 0.5 ** 2))
    assert acc.verify_width(3, batch=1, rule="proposed") == pytest.approx(acc.verify_width(3, rule="ragged"))
    # a trace that ran with k = 1 says nothing about proposing a 2nd token; bootstrap replicates keep proposals
    both = AcceptanceModel.from_traces([Trace(3, (0, 1, 0, 3), (0, 3, 2, 3)), Trace(1, (1, 0), (1, 1))])
    assert both.proposal_survival(3) == pytest.approx([5 / 6, 5 / 6 * 3 / 3, 5 / 6 * 2 / 3])
    rep = both.resample(np.random.default_rng(0))
    assert rep.offered is not None and rep.verify_width(3) <= 4
    draft = AcceptanceModel.from_traces(iid_traces(0.7, 3, n_req=5))  # no proposal lengths: always k
    assert draft.offered is None and draft.verify_width(3) == 4.0 and draft.mean_proposed(2) == 2.0
    with pytest.raises(SpecdecError, match="accepted..k"):
        AcceptanceModel.from_traces([Trace(3, (2,), (1,))])
    with pytest.raises(SpecdecError, match="verify rule"):
        acc.verify_width(3, rule="padded")


def test_ngram_step_cost_is_the_mean_over_its_verify_widths():
    """sd_step_s charges an n-gram step the mean of what its steps cost: at bs 1 a step without a proposal is a
    1-token forward (no multi-row cost) and the others verify 1 + their proposal; a draft model verifies k+1."""
    target = LinearCost(2e-3, 5e-5, 1e-7, 8e-4)  # d: a jump from 1 to more query rows
    c = CostModel("fixture", "tiny", "fitted", target, LinearCost(1e-4, 2.5e-6, 5e-9), ngram_fraction=0.05)
    props = (0, 3, 2, 3, 0, 1)
    acc = AcceptanceModel.from_traces([Trace(3, (0,) * len(props), props)])
    direct = np.mean([c.step_s(1, 3, 100, "ngram", 1 + p) for p in props])
    assert predict.sd_step_s(c, acc, 1, 3, 100, "ngram") == pytest.approx(direct)
    assert predict.sd_step_s(c, acc, 1, 3, 100, "ngram", verify="k") == pytest.approx(c.step_s(1, 3, 100, "ngram"))
    assert predict.sd_step_s(c, acc, 1, 3, 100, "draft") == pytest.approx(c.step_s(1, 3, 100, "draft"))
    assert direct < 0.9 * c.step_s(1, 3, 100, "ngram")
    # above bs 1 every step multiplies several rows: the mean width (rows are linear in it)
    assert predict.sd_step_s(c, acc, 8, 3, 100, "ngram") == pytest.approx(
        c.step_s(8, 3, 100, "ngram", 1 + np.mean(props)))


def test_jsonl_round_trip_and_bad_lines(tmp_path):
    traces = [Trace(5, (1, 5, 0)), Trace(3, (2,))]
    path = tmp_path / "t.jsonl"
    acceptance.write_jsonl(traces, path)
    assert acceptance.read_jsonl(path) == traces
    assert json.loads(path.read_text().splitlines()[0]) == {"k": 5, "accepted": [1, 5, 0]}
    path.write_text('{"k": 2, "accepted": [3]}\n')
    with pytest.raises(SpecdecError, match="line 1"):
        acceptance.read_jsonl(path)
    with_props = [Trace(3, (1, 0, 3), (2, 0, 3)), Trace(2, (2,))]
    acceptance.write_jsonl(with_props, path)
    assert acceptance.read_jsonl(path) == with_props
    assert json.loads(path.read_text().splitlines()[0])["proposed"] == [2, 0, 3]
    for bad in ('{"k": 3, "accepted": [2], "proposed": [1]}', '{"k": 3, "accepted": [1, 1], "proposed": [2]}',
                '{"k": 3, "accepted": [1], "proposed": [4]}', '{"k": 3, "accepted": [1], "proposed": 2}'):
        path.write_text(bad + "\n")
        with pytest.raises(SpecdecError, match="line 1.*proposed"):
            acceptance.read_jsonl(path)


def test_fixture_traces_load_and_bootstrap():
    traces, where = acceptance.load_traces("fixture", "tiny-vllm")
    acc = AcceptanceModel.from_traces(traces, where)
    assert "fixture/acceptance" in where and acc.max_k == 5
    assert acc.length_dist(5) == pytest.approx(acc.empirical_length_dist(5))
    boots = [acc.resample(np.random.default_rng(s)).expected_tokens(5) for s in range(50)]
    assert np.std(boots) > 0 and 1 <= min(boots) and max(boots) <= 6


# -- predictor ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_speedup_below_one_without_acceptance(batch, k):
    assert predict.speedup(costs(), AcceptanceModel.iid(0.0, 8), batch, k) < 1


@pytest.mark.parametrize("k", [1, 3, 5])
def test_speedup_above_one_for_cheap_draft_with_full_acceptance(k):
    s = predict.speedup(costs(), AcceptanceModel.iid(1.0, 8), 1, k)
    assert s > 1.5
    # by hand: (k+1) tokens for t_sd, 1 token for t_base
    t_base = TARGET.seconds(1, 1, 512)
    d = LinearCost(1e-4, 2.5e-6, 5e-9)
    t_sd = d.seconds(1, 2, 512) + (k - 1) * d.seconds(1, 1, 512) + TARGET.seconds(1, k + 1, 512)
    assert s == pytest.approx((k + 1) * t_base / t_sd)


def test_optimal_k_is_zero_when_draft_costs_as_much_as_target():
    cm = costs(draft=TARGET)
    for batch in (1, 8, 64):
        assert predict.optimal_k(cm, AcceptanceModel.iid(1.0, 8), batch)[0] == 0
    assert predict.optimal_k(costs(), AcceptanceModel.iid(0.9, 8), 1)[0] > 0


def test_optimal_k_shrinks_with_batch_size_on_a_compute_bound_target():
    cm = costs(target=LinearCost(2e-3, 2e-4, 0))  # verify cost grows fast with batched tokens
    acc = AcceptanceModel.iid(0.7, 8)
    ks = [predict.optimal_k(cm, acc, b)[0] for b in (1, 8, 64)]
    assert ks[0] > ks[1] >= ks[2] and ks[-1] == 0


def test_break_even_alpha_gives_speedup_one():
    cm = costs()
    for batch, k in ((1, 3), (16, 2)):
        a = predict.break_even_alpha(cm, batch, k)
        assert 0 < a < 1
        assert predict.speedup(cm, AcceptanceModel.iid(a, k), batch, k) == pytest.approx(1, abs=1e-6)
    assert predict.break_even_alpha(costs(draft=TARGET), 1, 2) is None


def test_policy_ranges_cover_all_batches():
    cm = costs(target=LinearCost(2e-3, 2e-5, 0))
    ranges = predict.policy(cm, AcceptanceModel.iid(0.7, 8), max_batch=256)
    assert ranges[0][0] == 1 and ranges[-1][1] == 256
    assert all(r[1] + 1 == s[0] for r, s in zip(ranges, ranges[1:]))
    assert all(a[2] != b[2] for a, b in zip(ranges, ranges[1:]))
    assert ranges[0][2] > ranges[-1][2] == 0


def test_interval_from_bootstrap_brackets_the_point():
    acc = AcceptanceModel.from_traces(iid_traces(0.6, 5, n_req=40))
    p = predict.predict(costmodel.load("fixture", "tiny-vllm"), acc, 2, 3, n_boot=200)
    assert p.lo < p.hi and p.cost_source == "fitted"
    exact = predict.predict(costs(), AcceptanceModel.iid(0.6, 5), 2, 3, n_boot=20)
    assert exact.lo == pytest.approx(exact.speedup) == pytest.approx(exact.hi)  # nothing to resample


def test_run_noise_widens_the_interval_and_is_absent_at_zero():
    """Issue 12 item 3 (G14): an interval checked against measured cells carries a cell's run-to-run noise;
    with run_log_sd 0 nothing is drawn, so the interval is the costs-and-acceptance one exactly."""
    from dataclasses import replace
    acc = AcceptanceModel.from_traces(iid_traces(0.6, 5, n_req=40))
    cm = costmodel.load("fixture", "tiny-vllm")
    plain = predict.predict(cm, acc, 2, 3, n_boot=200)
    assert predict.predict(replace(cm, run_log_sd=0.0), acc, 2, 3, n_boot=200) == plain
    noisy = predict.predict(replace(cm, run_log_sd=0.3), acc, 2, 3, n_boot=200)
    assert noisy.speedup == plain.speedup
    assert noisy.hi / noisy.lo > (plain.hi / plain.lo) * 1.5  # 90% of N(0, 0.3) alone spans exp(0.99) = 2.7x
    exact = predict.predict(replace(costs(), run_log_sd=0.1), AcceptanceModel.iid(0.6, 5), 2, 3, n_boot=400)
    assert np.log(exact.hi / exact.lo) == pytest.approx(2 * 1.645 * 0.1, rel=0.2)  # the noise alone


def test_run_log_sd_pools_pair_spread_over_paired_runs():
    """Pair log ratios [0.1, -0.1, 0] and [0.2, 0]: deviations 0.02 + 0.02 over 2 + 1 degrees of freedom,
    divided by the median pairs per run (2.5); a run with one pair or no base arm adds nothing."""
    rows = []
    for rid, logs in (("a", [0.1, -0.1, 0.0]), ("b", [0.2, 0.0]), ("c", [0.5])):
        for i, x in enumerate(logs):
            rows += [{"run_id": rid, "arm": "base", "pair_idx": i, "decode_tokens": 10.0, "decode_s": 2.0},
                     {"run_id": rid, "arm": "cell", "pair_idx": i, "decode_tokens": 10.0 * np.exp(x), "decode_s": 2.0}]
    rows += [{"run_id": "d", "arm": "cell", "pair_idx": i, "decode_tokens": 10.0 + i, "decode_s": 2.0} for i in range(3)]
    b = pd.DataFrame(rows)
    assert costmodel.run_log_sd(b) == pytest.approx(np.sqrt(0.04 / 3 / 2.5))
    assert costmodel.run_log_sd(b[b["run_id"].isin(["c", "d"])]) == 0.0


def test_static_steps_per_request_keeps_slow_requests_slow():
    acc = AcceptanceModel.from_traces([Trace(3, (3,) * 50), Trace(3, (0,) * 50)])
    # each sequence is all-fast (3 steps for 12 tokens) or all-slow (12 steps): a batch of 8 waits for a slow one
    assert predict.static_steps(acc, 3, 8, 12) == pytest.approx(12 - 9 / 256, abs=0.05)
    assert predict.static_steps(acc, 3, 8, 12, per_request=False) < 10


def test_static_seconds_charges_each_step_the_width_still_running():
    cost = {1: 1.0, 2: 1.5, 3: 2.0}
    # batch 1: widths 3, 3, 2, 2, 2 (one sequence done after 2 steps); batch 2: widths 3, 1, 1, 1
    finish = np.array([[5, 2, 5], [1, 4, 1]])
    assert predict.static_seconds(finish, cost.__getitem__) == pytest.approx(((2 * 2 + 3 * 1.5) + (2 + 3 * 1)) / 2)
    assert predict.static_seconds(np.full((4, 3), 7), cost.__getitem__) == pytest.approx(7 * 2.0)  # all at once
    half = AcceptanceModel.iid(0.5, 4)
    fin = predict.static_finish(half, 4, 16, 11, n_sim=200)
    assert fin.shape == (200, 16) and fin.min() >= 3 and fin.max() <= 11
    assert float(fin.max(axis=1).mean()) == predict.static_steps(half, 4, 16, 11, n_sim=200)


def test_static_steps_limits():
    assert predict.static_steps(AcceptanceModel.iid(1.0, 4), 4, 8, 11) == 3  # ceil(11 / 5)
    assert predict.static_steps(AcceptanceModel.iid(0.0, 4), 4, 8, 11) == 11
    half = AcceptanceModel.iid(0.5, 4)
    assert predict.static_steps(half, 4, 1, 11) < predict.static_steps(half, 4, 16, 11)  # slowest of 16


# -- CLI ----------------------------------------------------------------------------------------------
def run_cli(capsys, *args):
    with pytest.raises(SystemExit) as ex:
        cli.main(["advise", *args])
        raise SystemExit(0)
    out = capsys.readouterr()
    return ex.value.code, out.out, out.err


def test_advise_cli_on_fixture(capsys):
    code, out, err = run_cli(capsys, "--pair", "tiny-vllm", "--gpu", "fixture", "--batch", "4")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) <= 8 and lines[0].startswith("recommendation: ")
    assert "SD" in lines[0] and "interval" in out and "break-even" in out and "FITTED" in out
    ranges = json.loads(out.split("best k per batch-size range [first, last, k]: ", 1)[1])
    assert ranges[0][0] == 1 and ranges[-1][1] >= 256


def test_advise_cli_with_traces_file_on_prior_profile(capsys, tmp_path):
    path = tmp_path / "t.jsonl"
    acceptance.write_jsonl(iid_traces(0.8, 5, n_req=30), path)
    code, out, _ = run_cli(capsys, "--pair", "llama3.1-8b/llama3.2-1b", "--gpu", "h100", "--batch", "1", "--k", "3",
                           "--traces", str(path))
    assert code == 0 and "PRIOR" in out and "k=3" in out


@pytest.mark.parametrize("args,msg", [
    (["--pair", "nope", "--gpu", "fixture", "--batch", "4"], "unknown model pair"),
    (["--pair", "tiny", "--gpu", "nope", "--batch", "4"], "unknown hardware profile"),
    (["--pair", "tiny-vllm", "--gpu", "fixture", "--batch", "0"], "batch must be an integer in 1..4096"),
    (["--pair", "tiny-vllm", "--gpu", "fixture", "--batch", "4", "--k", "-1"], "k must be in 0..8"),
    (["--pair", "tiny-vllm", "--gpu", "fixture", "--batch", "4", "--k", "6"], "only cover k <= 5"),
    (["--pair", "tiny-vllm", "--gpu", "fixture", "--batch", "4", "--k", "9"], "k must be in 0..8"),
])
def test_advise_cli_bad_input_is_one_line_exit_2(capsys, args, msg):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and msg in err


def test_advise_without_traces_anywhere_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path))
    code, _, err = run_cli(capsys, "--pair", "tiny-vllm", "--gpu", "fixture", "--batch", "4")
    assert code == 2 and err.count("\n") == 1 and "--traces" in err


# -- validate -----------------------------------------------------------------------------------------
def test_validate_fixture_runs():
    df = advise.validate("fixture")
    # the torch engine's SD cells: k 2, 4 at bs 1-8 and n-gram k 2 at bs 1, 4
    assert len(df) == 10 and set(df["proposer"]) == {"draft", "ngram"}
    assert {"predicted", "measured", "abs_pct_err"} <= set(df.columns)
    assert (df["predicted"] > 0).all() and np.isfinite(df.attrs["mape"])
    assert df.attrs["mape"] == pytest.approx(df["abs_pct_err"].mean())


def _write(root, study, run_id, cell, tables, pair="tiny", torch=None):
    folder = root / "fixture" / study / run_id
    rawdata.write_run(folder, tables, {"study": study, "run_id": run_id, "profile": "fixture", "cell": cell,
                                       "config": {"pair": pair, **({"torch": torch} if torch else {})}})


BASE_CELL = {"mode": "static", "temperature": 0.0, "alpha": None, "quant": "none", "rate": None, "context": None}


def _write_forwards(root, truth):
    """The hardware study of a synthetic world: exact forward times of `truth` (costs fitted on them are exact)."""
    base = BASE_CELL
    for b in (1, 4, 16):  # one run per forward cell, as the harness writes them (cell keys become columns)
        for q in (1, 2, 4):
            for c in (32, 128):
                rows = [{"model": m, "repeat": 0, "batch": b, "query": q, "context": c, "tokens": b * q,
                         "seconds": float(truth.forward_s(m, b, q, c))} for m in ("target", "draft")]
                cell = dict(base, mode="forward", batch=b, k=q - 1, proposer="draft", context=c)
                _write(root, "hardware", f"fwd-bs{b}-q{q}-ctx{c}", cell, {"forwards": pd.DataFrame(rows)})


@pytest.mark.parametrize("verify", ["k", "ragged"])
def test_validate_prices_an_ngram_step_by_what_it_verified(tmp_path, monkeypatch, verify):
    """An n-gram lookup that finds no match proposes nothing: with verify ragged (vLLM's way) such a step is a plain
    1-token forward and the others verify 1 + their proposal. Raw data generated so (or padded to k+1 under verify k)
    must be predicted from the acceptance traces' proposal lengths, the width shown beside the measured one."""
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path))
    truth = costs(target=LinearCost(2e-3, 3e-4, 2e-7, 1.5e-3), draft=LinearCost(3e-4, 1e-5, 2e-8))
    _write_forwards(tmp_path, truth)
    rng = np.random.default_rng(1)

    def draw(size):  # (proposed, accepted) of `size` steps: half find no match, the rest propose 4
        prop = np.where(rng.random(size) < 0.5, 0, 4)
        acc = (rng.random((size, 4)) < 0.7).cumprod(axis=1).sum(axis=1)
        return prop, np.minimum(acc, prop)

    acc_steps = []
    for g in range(30):
        for _ in range(40):
            p, a = draw(4)
            acc_steps.append({"accepted": a.tolist(), "proposed": p.tolist(), "active": [True] * 4,
                              "rids": [0, 1, 2, 3], "repeat": 0, "batch_idx": g})
    _write(tmp_path, "acceptance", "acc", dict(BASE_CELL, batch=4, k=4, proposer="ngram"),
           {"steps": pd.DataFrame(acc_steps)})
    need, prompt, k = 15, 40, 3
    ctx = prompt + (need + 1) / 2
    for bs in (1, 4):
        for kk in (0, k):
            groups, steps_rows = [], []
            for g in range(200):
                if kk == 0:
                    groups.append({"repeat": 0, "batch_idx": g, "size": bs, "decode_tokens": bs * need,
                                   "steps": need, "decode_s": need * float(truth.step_s(bs, 0, ctx))})
                    continue
                done, decode_s, n_steps = np.zeros(bs, dtype=int), 0.0, 0
                while (done < need).any():  # every sequence stays to the end (finished: keep)
                    p, a = draw(bs)
                    c = np.minimum(p, kk)
                    width = 1 + (c.mean() if verify == "ragged" else kk)
                    if verify == "ragged" and not c.any():
                        width = 1.0
                    decode_s += float(truth.step_s(bs, kk, ctx, "ngram", width))
                    steps_rows.append({"step": n_steps, "batch": bs, "draft_s": 0.0, "verify_s": 0.0,
                                       "other_s": 0.0, "accepted": np.minimum(a, kk).tolist(),
                                       "proposed": c.tolist(), "active": (done < need).tolist(),
                                       "rids": list(range(bs)), "repeat": 0, "batch_idx": g})
                    done += np.minimum(a, kk) + 1
                    n_steps += 1
                groups.append({"repeat": 0, "batch_idx": g, "size": bs, "decode_tokens": bs * need,
                               "steps": n_steps, "decode_s": decode_s})
            reqs = [{"repeat": 0, "batch_idx": g, "rid": i, "prompt_tokens": prompt, "new_tokens": need + 1,
                     "prompt_set": "code", "prompt_idx": i} for g in range(200) for i in range(bs)]
            tabs = {"batches": pd.DataFrame(groups), "requests": pd.DataFrame(reqs)}
            if kk:
                tabs["steps"] = pd.DataFrame(steps_rows)
            _write(tmp_path, "batch", f"bs{bs}-k{kk}", dict(BASE_CELL, batch=bs, k=kk,
                                                             proposer="ngram" if kk else "none"),
                   tabs, torch={"verify": verify})
    df = advise.validate("fixture")
    assert len(df) == 2 and (df["verify"] == verify).all() and df.attrs["mape"] < 3, df
    expect = 1 + (0.5 * k if verify == "ragged" else k)
    assert df["predicted_width"].to_numpy() == pytest.approx([expect, expect], abs=0.05)
    assert df["measured_width"].to_numpy() == pytest.approx([expect, expect], abs=0.1)
    if verify == "ragged":  # priced as padded to k+1, the same cells would be predicted much slower
        padded = need * df["predicted_base_step_s"] / (df["predicted_steps"] * [
            float(truth.step_s(b, k, c, "ngram")) for b, c in zip(df["batch"], df["context"])])
        assert (padded < 0.85 * df["measured"]).all()


@pytest.mark.parametrize("finished", ["keep", "retire"])
def test_validate_recovers_a_synthetic_world(tmp_path, monkeypatch, finished):
    """Raw data generated from a known cost model and acceptance: validate must predict it closely, with a static
    batch's finished sequences kept to its end (computed at full width) or retired (torch.finished: retire: the
    tail runs narrower and cheaper)."""
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path))
    truth = costs(target=LinearCost(2e-3, 1e-4, 2e-7), draft=LinearCost(3e-4, 1e-5, 2e-8))
    _write_forwards(tmp_path, truth)
    # two kinds of request (think code and prose) with position-dependent acceptance each
    kinds = np.array([[0.95, 0.9, 0.85, 0.8], [0.6, 0.4, 0.3, 0.3]])
    rng = np.random.default_rng(0)

    def draw(kind, size):  # accepted counts (0..4) of `size` steps of requests of `kind`
        return (rng.random((size, 4)) < kinds[kind]).cumprod(axis=1).sum(axis=1)

    acc_steps = [{"accepted": [int(draw(r % 2, 1)[0]) for r in range(4)], "proposed": [4] * 4,
                  "active": [True] * 4, "rids": [0, 1, 2, 3], "repeat": 0, "batch_idx": g}
                 for g in range(15) for _ in range(40)]  # 60 requests of 40 steps
    _write(tmp_path, "acceptance", "acc", dict(BASE_CELL, batch=4, k=4, proposer="draft"),
           {"steps": pd.DataFrame(acc_steps)})
    need, prompt = 15, 40
    for bs in (1, 4):
        for k in (0, 3):
            groups = []
            ctx = prompt + (need + 1) / 2
            for g in range(300):
                if k == 0:
                    steps, decode_s = need, need * float(truth.step_s(bs, k, ctx))
                else:  # simulate this batch: every sequence is a random kind of request
                    per_seq = np.array([np.cumsum(np.minimum(draw(rng.integers(2), need), k) + 1) for _ in range(bs)])
                    finish = np.sort((per_seq >= need).argmax(axis=1) + 1)
                    steps = int(finish[-1])
                    if finished == "retire":  # steps between two finishes run the sequences still unfinished
                        gaps = np.diff(finish, prepend=0)
                        decode_s = sum(int(n) * float(truth.step_s(bs - j, k, ctx)) for j, n in enumerate(gaps))
                    else:
                        decode_s = steps * float(truth.step_s(bs, k, ctx))
                groups.append({"repeat": 0, "batch_idx": g, "size": bs, "decode_tokens": bs * need, "steps": steps,
                               "decode_s": decode_s})
            reqs = [{"repeat": 0, "batch_idx": g, "rid": i, "prompt_tokens": prompt, "new_tokens": need + 1}
                    for g in range(300) for i in range(bs)]
            _write(tmp_path, "batch", f"bs{bs}-k{k}", dict(BASE_CELL, batch=bs, k=k, proposer="draft" if k else "none"),
                   {"batches": pd.DataFrame(groups), "requests": pd.DataFrame(reqs)}, torch={"finished": finished})
    df = advise.validate("fixture")
    assert len(df) == 2 and df.attrs["mape"] < 3 and (df["finished"] == finished).all()
    full_width = need * df["predicted_base_step_s"] / (df["predicted_steps"] * df["predicted_step_s"])
    if finished == "retire":  # at bs 4 the narrowing tail is cheaper than full-width steps; bs 1 has no tail
        assert df.loc[1, "predicted"] > 1.03 * full_width[1] and df.loc[0, "predicted"] == pytest.approx(full_width[0])
        assert df.loc[1, "measured_step_s"] < 0.97 * df.loc[1, "predicted_step_s"]  # a mean over narrower steps
    else:
        assert df["predicted"].to_numpy() == pytest.approx(full_width.to_numpy())
        assert df["predicted_step_s"].to_numpy() == pytest.approx(df["measured_step_s"].to_numpy(), rel=1e-6)
    assert (df["predicted"] != df["predicted_steady"]).all()  # the static-batch tail is modelled
    pooled = advise.validate("fixture", per_request=False)  # ignores that slow requests hold up a batch
    assert pooled.loc[1, "predicted_steps"] < df.loc[1, "predicted_steps"]


def test_validate_without_data_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path))
    with pytest.raises(SpecdecError, match="no complete raw runs"):
        advise.validate("fixture")


def test_policy_compare_on_fixture():
    df = advise.policy_compare("fixture", fixed_k=4)
    assert set(df["policy"]) == {"off", "fixed k=4", "adaptive"}
    off = df[df["policy"] == "off"]
    assert (off["predicted"] == 1.0).all() and (off["measured"] == 1.0).all()
    fixed = df[df["policy"] == "fixed k=4"]
    assert fixed["measured"].notna().all()  # k=4 was measured at every fixture batch size
    adaptive = df[df["policy"] == "adaptive"].set_index("batch")["predicted"]
    assert (adaptive.values >= fixed.set_index("batch")["predicted"].values - 1e-12).all()


def test_advise_says_how_sure_it_is():
    """Issue 12 item 4: the cost source's kind, its validation error where one exists, the nearest measured cell."""
    from specdec.report import advise
    cpu = advise.advise("qwen2.5-coder-1.5b/0.5b", "cpu", 4, k=3, n_boot=0).certainty
    assert cpu.startswith("cost source: end to end on this profile's batch-study steps") and "held-out" in cpu
    assert "nearest measured cell(s): bs4 k=3 draft torch" in cpu and "bs4 k=3 draft vllm" in cpu
    h100 = advise.advise("llama3.1-8b/eagle", "h100", 16, proposer="eagle", traces="llama3.1-8b-h100/cnn",
                    n_boot=0)
    assert "published coefficients" in h100.certainty and "paper's measured speedups" in h100.certainty
    assert "no measured cell on h100" in h100.certainty
    assert any(line.startswith("how sure: ") for line in h100.lines())
    l4 = advise.advise("llama3.1-8b/eagle", "l4", 16, proposer="eagle", traces="llama3.1-8b-h100/cnn", n_boot=0)
    assert "roofline prior" in l4.certainty and "not validated" in l4.certainty


def test_the_decision_map_inverts_acceptance_and_places_measured_cells():
    """Issue 12 item 5: predicted speedup over batch x alpha, break-even, measured cells at their implied alpha."""
    from specdec.report import analysis, views
    for a, k in ((0.0, 3), (0.5, 3), (0.8, 1), (0.9, 6)):
        assert views._iid_alpha(analysis.iid_tokens_per_step(a, k), k) == pytest.approx(a, abs=1e-6)
    assert np.isnan(views._iid_alpha(5.0, 3))  # more than k+1 tokens per step: no alpha
    grid, pts, note = views.decision_map("fixture")
    assert len(grid) == len(views.MAP_BATCHES) * len(views.MAP_ALPHAS) and np.isfinite(grid["speedup"]).all()
    assert (grid["best_k"].between(1, 8)).all()
    # more acceptance never predicts less speedup at the same batch size
    for _, g in grid.groupby("batch"):
        assert np.all(np.diff(g.sort_values("alpha")["speedup"].to_numpy()) >= -1e-9)
    assert len(pts) and set(pts["engine"]) == {"torch", "vllm"} and pts["alpha"].between(0, 1).all()
    assert "FITTED" in note
