"""The H200 measurements (issue 15): what analysis makes of them, the warm-up rule, the cost-fit comparison with
the paper's H100 fit, and the predicted offload profile."""
from __future__ import annotations

import pandas as pd
import pytest

from specdec.data import config, models
from specdec.model import costmodel
from specdec.report import analysis, claims, views


def test_warm_up_drops_each_runs_first_timed_batches_in_time_order():
    df = pd.DataFrame({"run_id": ["a"] * 6 + ["b"] * 2, "batch_idx": [1, 0, 0, 0, 0, 1, 0, 0],
                       "repeat": [0, 2, 1, 0, 0, 0, 0, 1], "arm": ["cell", "cell", "cell", "cell", "base", "base",
                                                                    "cell", "cell"]})
    out = analysis.warm_up(df, 1)
    assert not ((out["run_id"] == "a") & (out["batch_idx"] == 0) & (out["repeat"] == 0)).any()  # both arms
    assert len(out) == 5 and len(out[out["run_id"] == "b"]) == 1
    assert analysis.warm_up(df, 0) is df
    assert len(analysis.warm_up(df, 2)) == 3


def test_h200_cells_leave_out_their_first_timed_batch_and_the_hash_ignores_the_rule():
    assert analysis.warmup_batches("h200", "batch") == 1 and analysis.warmup_batches("cpu", "batch") == 0
    raw = analysis.tables.load("h200", "batch", "batches")
    kept = analysis.load("batch", "h200", "batches")
    assert len(raw) - len(kept) == raw["run_id"].nunique()
    cfg = config.load_study("batch", "h200")
    bare = dict(cfg, timing={k: v for k, v in cfg["timing"].items() if k != "warmup_batches"})
    assert config.config_hash(cfg) == config.config_hash(bare)


def test_a_replayed_datasets_baseline_is_its_own():
    sp = analysis.speedup("h200", "batch")
    assert set(sp["trace"]) == {"cnn", "sharegpt"}
    for _, r in sp.iterrows():
        assert r["baseline_run"].split("-")[4] == r["trace"]  # bs1-k0-none-t0-<trace>-<hash>
    base = sp[sp["k"] == 0]
    assert (base["speedup"] == 1).all()


def test_h200_runs_say_they_are_synthetic_and_the_claims_say_so():
    assert views.synthetic("h200", "batch") and not views.synthetic("cpu", "batch")
    v = claims.verdicts("h200").set_index("claim")
    assert "synthetic weights" in v.loc["C1", "basis"]


def test_the_fit_stands_beside_the_papers_h100_fit_of_the_same_shape():
    assert models.target_shape("synthetic:llama3.1-8b/llama3.2-1b") == models.target_shape("llama3.1-8b/eagle")
    df = costmodel.compare_target("h200")
    assert {"fitted", "published", "prior"} == set(df["source"])
    assert (df.loc[df["source"] == "fitted", "ratio"] == 1).all()
    pub = df[df["source"] == "published"]
    assert set(pub["profile"]) == {"h100"} and (pub["pair"] == "llama3.1-8b/eagle").all()
    # the published coefficients are the h100 yaml's, read back unchanged
    assert pub["fixed_s"].iloc[0] == pytest.approx(costmodel.published("h100", "llama3.1-8b/eagle").target.a)


def test_an_offload_profile_streams_only_the_targets_weights_over_the_host_link():
    on, off = costmodel.prior("h100", "llama3.1-8b/llama3.2-1b"), costmodel.prior("h100-offload",
                                                                                   "llama3.1-8b/llama3.2-1b")
    t = off.target.seconds(1, 1, 512)
    assert t >= off.target.weight_bytes / 0.064e12  # at least the weights over 64 GB/s
    assert t > 20 * on.target.seconds(1, 1, 512)
    assert off.draft.seconds(1, 1, 512) == on.draft.seconds(1, 1, 512)  # the draft stays resident
    # verification is nearly free there: 4 tokens cost about what 1 does
    assert off.target.seconds(32, 4, 512) / off.target.seconds(32, 1, 512) < 1.05


def test_measured_offload_forwards_are_link_bound():
    f = analysis.forward_times("h200", "hardware")
    off = f[f["model"] == "target-offload"]
    on = f[(f["model"] == "target") & (f["context"] == 256)]
    assert len(off) == 6
    # streaming ~15 GB of layers per forward: each forward costs several times the resident one, and the batch
    # size hardly matters (<= 20% from bs 1 to 64)
    assert off["seconds"].min() > 3 * on["seconds"].max()
    assert off["seconds"].max() / off["seconds"].min() < 1.2
