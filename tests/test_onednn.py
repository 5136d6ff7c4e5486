"""The torch engine's oneDNN Linear path (config `torch: {linear: onednn}`): same outputs, same SD guarantees."""
import shutil

import pandas as pd
import pytest
import torch

from specdec import paths
from specdec.data import config, rawdata
from specdec.data.models import load_pair
from specdec.data.spec import Study
from specdec.engines import harness, onednn
from specdec.engines.engine import GenConfig, generate
from specdec.errors import SpecdecError

PAD = 258


@pytest.fixture(scope="module")
def pairs():
    """The tiny pair in fp32 twice: dense, and with every Linear packed."""
    dense = load_pair("tiny", dtype=torch.float32)
    packed = load_pair("tiny", dtype=torch.float32)
    n = onednn.pack_linears(packed.target) + onednn.pack_linears(packed.draft)
    return dense, packed, n


def _prompts(n, repeat=False):
    g = torch.Generator().manual_seed(n)
    out = [torch.randint(0, 256, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist()
           for _ in range(n)]
    return [p + p for p in out] if repeat else out


def test_every_linear_is_packed_and_outputs_match(pairs):
    dense, packed, n = pairs
    linears = sum(type(m) is torch.nn.Linear for m in dense.target.modules())
    linears += sum(type(m) is torch.nn.Linear for m in dense.draft.modules())
    assert n == linears > 0
    assert not any(type(m) is torch.nn.Linear for m in packed.target.modules())
    ids = torch.tensor([_prompts(1)[0]])
    with torch.no_grad():
        a, b = dense.target(input_ids=ids).logits, packed.target(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    assert (a.argmax(-1) == b.argmax(-1)).all()


@pytest.mark.parametrize("bs,proposer,k", [(1, "draft", 3), (4, "draft", 3), (4, "ngram", 4)])
def test_greedy_sd_on_packed_weights_equals_its_plain_decoding(pairs, bs, proposer, k):
    _, packed, _ = pairs
    prompts = _prompts(bs, repeat=proposer == "ngram")
    run = lambda **kw: generate(packed.target, packed.draft, prompts, GenConfig(**kw), pad_token_id=PAD)[0]
    base = run(k=0, max_new_tokens=24)
    sd = run(k=k, proposer=proposer, max_new_tokens=24)
    assert [s.generated for s in sd.seqs] == [b.generated for b in base.seqs]
    assert sum(sum(r["accepted"]) for r in sd.steps) > 0


def test_unusable_models_get_one_line_reasons():
    fp64 = load_pair("tiny", with_draft=False).target  # the tiny pair's default is fp64
    assert "fp32" in onednn.usable(fp64)
    with pytest.raises(ValueError, match="fp32"):
        onednn.pack_linears(fp64)
    with pytest.raises(ValueError, match="unknown linear path"):
        onednn.apply(fp64, "fast")
    with pytest.raises(SpecdecError, match="torch.linear: onednn: .*fp32"):
        harness.ModelCache("tiny", "float64", "cpu", linear="onednn")


def test_config_key_is_checked():
    cfg = dict(config.load_study("batch", "fixture"), torch={"linear": "fast"})
    with pytest.raises(SpecdecError, match="torch.linear must be one of dense, onednn"):
        Study.from_dict(cfg)
    with pytest.raises(SpecdecError, match="unknown key"):
        Study.from_dict(dict(cfg, torch={"kernel": "onednn"}))


def test_torch_section_is_in_the_torch_hash_only():
    cfg = config.load_study("batch", "fixture")
    assert "torch" not in cfg
    # no torch section: both engines hash as every run did before the section existed
    assert config.config_hash(cfg, "torch") == config.config_hash(cfg, "vllm") == config.config_hash(cfg)
    packed = dict(cfg, torch={"linear": "onednn"})
    assert config.config_hash(packed, "vllm") == config.config_hash(cfg, "vllm")
    assert config.config_hash(packed, "torch") != config.config_hash(cfg, "torch")
    with pytest.raises(ValueError, match="unknown engine"):
        config.config_hash(cfg, "tgi")


def test_older_torch_runs_are_ignored_while_vllm_runs_stay_current():
    """The shipped cpu batch runs: vLLM's (hashed before the torch section existed) still match the config;
    the torch engine's dense-path runs of the same config do not."""
    rawdata._HASHES.clear()
    runs = rawdata.current_runs("batch", "cpu", warn=lambda *_: None)
    engines = {meta.get("engine") for _, meta in runs}
    assert "vllm" in engines
    cfg = config.load_study("batch", "cpu")
    for _, meta in runs:
        assert meta["config_sha256"] == config.config_hash(cfg, meta.get("engine") or "torch")


def test_current_hash_follows_the_root(tmp_path, monkeypatch):
    """The hash cache is per root and per config file version: a second root with another batch.yaml (as the
    vLLM end-to-end test builds) must not get the first root's hash (CI failure on 2026-12-04)."""
    first = rawdata._current_hash("batch", "fixture", "torch")
    shutil.copytree(paths.configs() / "hardware", tmp_path / "configs" / "hardware")
    text = (paths.configs() / "batch.yaml").read_text().replace("seed: 0", "seed: 1", 1)
    assert "seed: 1" in text
    (tmp_path / "configs" / "batch.yaml").write_text(text)
    monkeypatch.setenv("SPECDEC_ROOT", str(tmp_path))
    second = rawdata._current_hash("batch", "fixture", "torch")
    assert second != first
    assert second == config.config_hash(config.load_study("batch", "fixture"), "torch")
    (tmp_path / "configs" / "batch.yaml").write_text(text.replace("seed: 1", "seed: 22", 1))
    assert rawdata._current_hash("batch", "fixture", "torch") != second  # edited in place: re-read


def test_a_study_without_a_vllm_section_takes_the_profiles_for_vllm_only():
    """configs/hardware/cpu.yaml's `vllm:` settings reach vLLM's view (config, hash) of a study that has none (the
    cpu acceptance study); the torch hash, and every study with its own section (batch, serving), are unchanged."""
    acc = config.load_study("acceptance", "cpu")
    assert "vllm" not in acc
    view = config.engine_view(acc, "vllm")
    assert view["vllm"]["kv_cache_memory_bytes"] == 536870912 and config.engine_view(acc, "torch") is acc
    assert config.config_hash(acc, "vllm") == config.config_hash(view, "vllm") != config.config_hash(
        dict(acc, vllm={}), "vllm")
    assert config.config_hash(acc, "torch") == config.config_hash(acc)
    for study in ("batch", "serving"):
        cfg = config.load_study(study, "cpu")
        assert config.engine_view(cfg, "vllm") is cfg
    # the shipped torch acceptance runs on cpu stay current, and a vLLM run's hash is the vLLM view's
    rawdata._HASHES.clear()
    runs = rawdata.current_runs("acceptance", "cpu", warn=lambda *_: None)
    torch_runs = [m for _, m in runs if m.get("engine", "torch") == "torch"]
    assert torch_runs and all(m["config_sha256"] == config.config_hash(acc, "torch") for m in torch_runs)
    assert all(m["config_sha256"] == config.config_hash(acc, "vllm") for _, m in runs if m.get("engine") == "vllm")


def test_step_profile_splits_a_decode_step_by_operator_family(tmp_path):
    """stepprofile (issue 17 item 7): a bare decode forward of the tiny target and the engine's own decode steps,
    each profiled per operator family: the Linears and attention are found, each part's shares add up to 1, and
    the CSV is written; the cache append copies every layer's whole cache, so its seconds grow with the context
    (8 vs 2048 KV tokens)."""
    from specdec.engines import stepprofile

    out = tmp_path / "p.csv"
    stepprofile.main(["--pair", "tiny", "--batch", "2", "--context", "8", "--linear", "onednn", "--out", str(out)])
    df = pd.read_csv(out)
    assert set(df["what"]) == {"bare forward", "engine decode"}
    for _, part in df.groupby("what"):
        assert {"linear", "attention"} <= set(part["family"]) and (part["seconds"] > 0).all()
        assert part["share"].sum() == pytest.approx(1.0) and (part["step_s"] > 0).all()
    assert stepprofile.family("mkldnn::_linear_pointwise") == "linear" and stepprofile.family("aten::relu") == "other"
    model = load_pair("tiny", torch.float32, with_draft=False).target.eval()
    small, big = (stepprofile.profile_step(model, 8, c).set_index("family").loc["kv append (cat)", "seconds"]
                  for c in (8, 2048))
    assert big > small


def test_masked_attention_with_enable_gqa_equals_repeated_kv():
    """stepprofile.gqa_attention: torch's sdpa with enable_gqa and an explicit mask gives what transformers'
    repeat_kv path gives (the engine's masks with holes), so the engine could skip the copy; both timed."""
    from specdec.engines import stepprofile

    got = stepprofile.gqa_attention(batch=3, heads=4, kv_heads=2, context=40, head_dim=16, layers=2, repeats=1)
    assert got["same"] is True and got["repeat_kv_s"] > 0 and got["enable_gqa_s"] > 0
