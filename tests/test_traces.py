"""Imported per-position traces (the paper's format), the trace replay, published costs, advise on real traces,
measured-or-predicted views and the claims they feed."""
import json

import numpy as np
import pandas as pd
import pytest

from specdec import cli
from specdec.data import traces as tr
from specdec.data.spec import Study
from specdec.engines.vllm_runner import check_speculative_config
from specdec.errors import SpecdecError
from specdec.model import acceptance, costmodel, predict, replay
from specdec.model.costmodel import CostModel, DraftStepCost, LinearCost
from specdec.report import advise
from specdec.report import claims, views

PAPER = tr.PAPER["name"]


def paper_line(rid, prompt_len, eagle, ngram):
    """One line in the simulator's own format (token ids are arbitrary ints)."""
    return json.dumps({"id": rid, "prompt_token_ids": list(range(prompt_len)),
                       "generated_token_ids": list(range(len(eagle))),
                       "acc_eagle": {"acc_len": eagle}, "acc_ngram": {"acc_len": ngram}})


@pytest.fixture
def paper_dir(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "combined_alpha.jsonl").write_text(
        paper_line("a", 10, [1, 3, 2, 1, 5, 1, 1, 2], [1, 1, 1, 4, 1, 1, 1, 1]) + "\n" +
        paper_line("b", 4, [2, 2, 2, 2], [1, 1, 1, 1]) + "\n")
    (src / "combined_beta.jsonl").write_text(paper_line("c", 6, [4, 1, 1, 1, 1], [1, 2, 1, 1, 1]) + "\n")
    return src


def test_import_reads_the_simulator_format_as_is(paper_dir, tmp_path):
    out = tr.import_paper(paper_dir, "toy", ["beta"], "llama3.1-8b/eagle", "h100", {"alpha": 0.5}, "toy source",
                          "toy licence", out_root=tmp_path / "traces", echo=lambda _m: None)
    meta = json.loads((out / "source.json").read_text())
    assert meta["datasets"]["alpha"]["requests"] == 2 and meta["datasets"]["beta"]["held_out"]
    assert meta["cap"] == 5 and meta["datasets"]["alpha"]["ngram_match_prob"] == 0.5
    rows = [json.loads(line) for line in (out / "alpha.jsonl").read_text().splitlines()]
    assert rows[0] == {"id": "a", "prompt_len": 10, "acc": {"eagle": [1, 3, 2, 1, 5, 1, 1, 2],
                                                           "ngram": [1, 1, 1, 4, 1, 1, 1, 1]}}
    with pytest.raises(SpecdecError, match="exists already"):
        tr.import_paper(paper_dir, "toy", [], "p", "h100", {}, "", "", out_root=tmp_path / "traces",
                        echo=lambda _m: None)


def test_import_rejects_a_file_that_is_not_the_format(tmp_path):
    (tmp_path / "combined_bad.jsonl").write_text('{"id": 1, "acc_eagle": {"acc_len": [0, 2]}}\n')
    with pytest.raises(SpecdecError, match="line 1: expected the simulator format"):
        tr.import_paper(tmp_path, "bad", [], "p", "h100", {}, "", "", out_root=tmp_path / "out", echo=lambda _m: None)


def test_shipped_collection_keeps_held_out_sets_apart():
    assert tr.datasets(PAPER, held_out=True) == ["gsm8k", "instructcoder"]
    assert tr.datasets(PAPER, held_out=False) == ["cnn", "sharegpt"]
    ts = tr.load(PAPER, "cnn", "eagle")
    assert len(ts.requests) == 300 and ts.max_k == 20 and not ts.held_out and ts.match_prob is None
    assert tr.load(PAPER, "gsm8k", "ngram").match_prob == 0.2


@pytest.mark.parametrize("k,starts,emitted", [
    (1, [1, 2, 4, 5, 7], [1, 2, 1, 2, 1]),
    (3, [1, 2, 5], [1, 3, 4]),
    (8, [1, 2, 5], [1, 3, 5]),
])
def test_replay_emits_min_acc_len_k_plus_one_from_where_each_step_starts(k, starts, emitted):
    # acc_len at positions 1..8; the first token comes from the prefill
    s, e = tr.steps([1, 3, 2, 1, 5, 1, 1, 2], k)
    assert s.tolist() == starts and e.tolist() == emitted
    assert 1 + e.sum() >= 8 and 1 + e[:-1].sum() < 8


def _toy_set(acc, prompt=10, match=None, proposer="eagle"):
    return tr.TraceSet("toy", "toy", proposer, (tr.Request("r", prompt, tuple(acc)),), 21, match, False, "p", "h100")


def test_replay_latencies_by_hand():
    c = CostModel("h100", "p", "published", LinearCost(1.0, 0.1, 0.0), DraftStepCost(0.5, 0.0, 0.0), overhead_s=0.0)
    ts = _toy_set([1, 3, 2, 1, 5, 1, 1, 2])
    lat = replay.request_latencies(ts, c, batch=1, k=3, prefill=False)
    # no SD: 7 one-token steps of 1.1 s; SD: 3 steps (emitting 1, 3, 4) of verify 1.4 s + draft 0.5 s
    assert lat["org_s"].iloc[0] == pytest.approx(7 * 1.1)
    assert lat["sd_s"].iloc[0] == pytest.approx(3 * 1.9)
    with_prefill = replay.request_latencies(ts, c, batch=2, k=3, prefill=True)
    assert with_prefill["org_s"].iloc[0] == pytest.approx((1 + 0.1 * 20) + 7 * (1 + 0.2))
    assert replay.speedup(ts, c, 1, 3, prefill=False)["speedup"] == pytest.approx(7 * 1.1 / (3 * 1.9))


def test_ngram_steps_that_propose_nothing_cost_a_plain_step():
    c = CostModel("h100", "p", "published", LinearCost(1.0, 0.1, 0.0), None, ngram_fraction=0.5)
    never = replay.request_latencies(_toy_set([1] * 9, match=0.0, proposer="ngram"), c, 1, 3, prefill=False)
    always = replay.request_latencies(_toy_set([1] * 9, match=1.0, proposer="ngram"), c, 1, 3, prefill=False)
    assert never["sd_s"].iloc[0] == pytest.approx(never["org_s"].iloc[0])
    assert always["sd_s"].iloc[0] == pytest.approx(8 * 1.4 * 1.5)


def test_replay_reproduces_the_paper_simulator_on_the_build_datasets():
    """cnn and sharegpt only (gsm8k and instructcoder are held out): the simulator's own published
    numbers, produced by running its main.py, against our replay with the same published costs."""
    ref = views.reference(PAPER)
    ref = ref[ref["dataset"].isin(tr.datasets(PAPER, held_out=False)) & (ref["k"] == 3)]
    assert len(ref) >= 12
    costs = costmodel.load("h100", "llama3.1-8b/eagle")
    errs = [abs(replay.speedup(tr.load(PAPER, r.dataset, r.proposer), costs, r.batch, r.k, n_boot=0)["speedup"]
                / r.speedup - 1) for r in ref.itertuples()]
    assert np.mean(errs) < 0.03 and max(errs) < 0.06


# -- costs ----------------------------------------------------------------------------------------------------
def test_published_h100_costs_come_from_the_profile_yaml():
    c = costmodel.load("h100", "llama3.1-8b/eagle")
    assert c.source == "published" and "PUBLISHED" in c.describe() and "Llama8BH100" in c.describe()
    assert c.target.a == pytest.approx(5.88590713e-03) and isinstance(c.draft, DraftStepCost)
    # the paper's target forward: kv_total * c_kv + batched_tokens * c_compute + c_fixed
    assert c.forward_s("target", 8, 4, 500) == pytest.approx(8 * 500 * 3.92645679e-08 + 32 * 2.10103129e-05
                                                             + 5.88590713e-03)
    assert c.draft_s(8, 3, 500, "ngram") == pytest.approx(0.005875 * c.forward_s("target", 8, 4, 500))
    assert c.resample(np.random.default_rng(0)) is c
    # other pairs on h100 still fall back to the roofline prior
    assert costmodel.load("h100", "llama3.1-8b/llama3.2-1b").source == "prior"


def test_bad_published_costs_are_one_line_errors(tmp_path, monkeypatch):
    from specdec import paths
    root = tmp_path / "repo"
    (root / "configs" / "hardware").mkdir(parents=True)
    (root / "configs" / "hardware" / "x.yaml").write_text(
        "name: x\nkind: gpu\nmatch: {cuda: true}\ncosts:\n  llama3.1-8b/eagle: {target: {fixed_s: 1, per_token_s: -1, per_kv_token_s: 0}}\n")
    monkeypatch.setattr(paths, "root", lambda: root)
    with pytest.raises(SpecdecError, match="per_token_s must be a number >= 0"):
        costmodel.published("x", "llama3.1-8b/eagle")


def test_fitted_describe_without_fits_does_not_crash():
    c = CostModel("cpu", "tiny", "fitted", LinearCost(1, 1, 1), LinearCost(1, 1, 1))
    assert "FITTED" in c.describe()


# -- acceptance conditioned on k --------------------------------------------------------------------------------
def test_replay_acceptance_is_exact_per_k_and_differs_from_assuming_independence():
    ts = tr.load(PAPER, "cnn", "eagle")
    acc = acceptance.ReplayAcceptance.from_trace_set(ts, 6)
    for k in (1, 3, 6):
        steps = sum(len(tr.steps(r.acc_len, k)[0]) for r in ts.requests)
        toks = sum(r.generated_len - 1 for r in ts.requests)
        assert acc.expected_tokens(k) == pytest.approx(toks / steps, rel=0.02)
    # treating every position as a step start (independence) overstates tokens/step at k=6
    naive = np.mean([min(a, 7) for r in ts.requests for a in r.acc_len])
    assert naive > acc.expected_tokens(6) * 1.05


# -- advise ------------------------------------------------------------------------------------------------------
def run_cli(capsys, *args):
    with pytest.raises(SystemExit) as e:
        cli.main(list(args))
        raise SystemExit(0)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


@pytest.mark.parametrize("proposer", ["eagle", "ngram"])
def test_advise_on_the_papers_traces_prints_a_config_vllm_accepts(capsys, proposer):
    code, out, err = run_cli(capsys, "advise", "--pair", "llama3.1-8b/eagle", "--gpu", "h100", "--batch", "1",
                             "--proposer", proposer, "--traces", f"{PAPER}/cnn", "--prefill")
    assert code == 0 and err == "" and "PUBLISHED" in out and "prefill of" in out
    assert out.startswith("recommendation: ENABLE SD")
    conf = json.loads(out.split("--speculative-config '", 1)[1].split("'", 1)[0])
    check_speculative_config(conf)
    assert conf["method"] == proposer and conf["num_speculative_tokens"] >= 1


def test_advise_at_a_batch_where_sd_loses_prints_no_config(capsys):
    costs = CostModel("h100", "llama3.1-8b/eagle", "published", LinearCost(1e-3, 1e-3, 0), DraftStepCost(1, 0, 0))
    adv = advise.advise("llama3.1-8b/eagle", "h100", 64, traces=f"{PAPER}/gsm8k", proposer="eagle", n_boot=0)
    assert adv.best_k >= 0
    pred = predict.speedup(costs, acceptance.ReplayAcceptance.from_trace_set(tr.load(PAPER, "gsm8k", "eagle"), 3),
                           64, 3, 500, "eagle")
    assert pred < 1  # a draft step of 1 s never pays
    adv0 = advise.Advice("p", "h100", 64, 500, False, 3, True, 0, adv.prediction, 1, None, (None, None),
                          costs, adv.acc, None, "eagle")
    assert any("without --speculative-config" in line for line in adv0.lines())


@pytest.mark.parametrize("conf,msg", [
    ({"method": "eagle", "model": "m", "num_speculative_tokens": 0}, "integer >= 1"),
    ({"num_speculative_tokens": 3}, "needs method"),
    ({"method": "eagle", "num_speculative_tokens": 3}, "needs a draft 'model'"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
      "num_speculative_tokens_per_batch_size": [[1, 2, 3]]}, "does not accept"),
])
def test_speculative_config_check_rejects_what_vllm_rejects(conf, msg):
    with pytest.raises(SpecdecError, match=msg):
        check_speculative_config(conf)


def test_advise_traces_errors_are_one_line(capsys):
    code, _, err = run_cli(capsys, "advise", "--pair", "llama3.1-8b/eagle", "--gpu", "h100", "--batch", "1",
                           "--traces", f"{PAPER}/cnn")
    assert code == 2 and err.count("\n") == 1 and "--proposer eagle or ngram" in err
    code, _, err = run_cli(capsys, "advise", "--pair", "llama3.1-8b/eagle", "--gpu", "h100", "--batch", "1",
                           "--proposer", "eagle", "--traces", f"{PAPER}/nosuch")
    assert code == 2 and "no dataset 'nosuch'" in err


# -- views and claims ----------------------------------------------------------------------------------------------
def test_views_say_measured_predicted_or_nothing(capsys):
    assert views.mode("cpu", "batch").kind == "measured"
    assert views.mode("h100", "batch").kind == "predicted" and "PUBLISHED" in views.mode("h100", "batch").text
    assert views.mode("a100", "hardware").kind == "predicted" and "PRIOR" in views.mode("a100", "hardware").text
    assert views.mode("h100", "alternatives").kind == "none"
    code, out, _ = run_cli(capsys, "sources", "--gpu", "h100")
    assert code == 0 and "batch: PREDICTED" in out and "bench: NO DATA" in out


def test_a_profile_with_nothing_to_show_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_RAW", str(tmp_path))
    code, out, err = run_cli(capsys, "sources", "--gpu", "fixture")
    assert code == 2 and out == "" and err.count("\n") == 1 and "nothing to show" in err


def test_predicted_speedup_table_has_the_measured_columns():
    sp = views.speedup("h100")
    meas = views.speedup("fixture")
    assert {"batch", "k", "proposer", "speedup", "ci_lo", "ci_hi", "throughput_tok_s", "quant", "alpha"} <= \
        set(sp.columns) & set(meas.columns)
    assert set(sp["basis"]) == {"predicted"} and set(meas["basis"]) == {"measured"}
    assert sorted(sp["batch"].unique()) == list(views.BATCHES)
    sd = sp[sp["k"] > 0]
    assert (sd["ci_lo"] <= sd["speedup"]).all() and (sd["speedup"] <= sd["ci_hi"]).all()
    # the paper's phenomenon under its own inputs: EAGLE's advantage shrinks with batch size
    e = sd[sd["proposer"] == "eagle: cnn"].set_index("batch")["speedup"]
    assert e[1] > e[128] > 0


def test_claims_on_h100_are_predicted_and_say_so():
    df = claims.verdicts("h100")
    row = df.set_index("claim")
    for cid in ("C1", "C2", "C7"):
        assert row.loc[cid, "basis"] == "predicted" and row.loc[cid, "verdict"] != claims.NOT_MEASURABLE
    assert row.loc["C8", "verdict"] == claims.NOT_MEASURABLE
    assert "predicted" in claims.to_markdown(df)
    assert row.loc["C1", "measured"] == pytest.approx(
        views.speedup("h100").query("batch == 1 and k == 3 and proposer.str.startswith('eagle')")["speedup"].max())


def test_predicted_tables_are_labelled_in_figures():
    import matplotlib.pyplot as plt
    from specdec.report import figures
    src = views.mode("h100", "batch")
    fig = figures.stamp(figures.batch_speedup(views.speedup("h100"), "h100"), src)
    assert fig.axes[0].get_title().endswith("[predicted]")
    assert any("PREDICTED" in t.get_text() for t in fig.texts)
    plt.close(fig)
    assert isinstance(views.forward_times("h100"), pd.DataFrame) and len(views.forward_ratio("a100"))


def test_gpu_install_does_not_pin_the_cpu_torch():
    import tomllib
    from specdec import paths
    meta = tomllib.loads((paths.root() / "lib" / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith(("torch", "transformers")) for d in meta["dependencies"])
    assert not any("==" in d for d in meta["optional-dependencies"]["gpu"])
    assert "torch==2.13.0" in meta["optional-dependencies"]["cpu"]


def test_every_hub_draft_model_pair_shares_its_vocabulary():
    from specdec.data import models
    from specdec.engines.vllm_runner import speculative_config
    for name, spec in models.PAIRS.items():
        if spec.hub_draft and "eagle" not in spec.hub_draft.lower():
            assert spec.vocab and spec.vocab[0] == spec.vocab[1], name
            check_speculative_config(speculative_config(Study(name), {"k": 3, "proposer": "draft"}))
    with pytest.raises(SpecdecError, match="was removed: .*152064"):
        models.pair_spec("qwen2.5-7b/0.5b")


@pytest.mark.parametrize("machine,ok", [
    ({"cuda": False, "cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "cpu_flags": ["amx_bf16"]}, True),
    ({"cuda": False, "cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "cpu_flags": []}, False),
    ({"cuda": False, "cpu": "AMD EPYC", "cores": 2, "cpu_flags": ["amx_bf16"]}, False),
    ({"cuda": False, "cpu": "Intel(R) Xeon(R) Processor", "cores": 8, "cpu_flags": ["amx_bf16"]}, False),
])
def test_cpu_profiles_refuse_another_cpu(machine, ok):
    from specdec.data import hardware
    prof = hardware.load_profile("cpu-bf16")
    if ok:
        hardware.check_machine(prof, machine)
    else:
        with pytest.raises(SpecdecError, match="cpu-bf16"):
            hardware.check_machine(prof, machine)
    hardware.check_machine(hardware.load_profile("fixture"), machine)  # the fixture runs anywhere
