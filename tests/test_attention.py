"""The torch engine's attention path (config `torch: {attention: gqa}`): same tokens, KV heads read in place."""
import pytest
import torch

from specdec.data import config
from specdec.data.models import load_pair
from specdec.data.spec import Study
from specdec.engines import attention, harness
from specdec.engines.engine import GenConfig, generate
from specdec.errors import SpecdecError

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [5, 5, 5, 5, 1]]  # unequal lengths: padding holes in the mask


def _spy(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **kw):
        calls.append(bool(kw.get("enable_gqa", False)))
        return real(*a, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("k, proposer", [(0, "none"), (3, "draft"), (3, "ngram")])
def test_gqa_path_gives_the_sdpa_paths_tokens_without_repeating_kv(monkeypatch, k, proposer):
    """The tiny pair has 4 query heads on 2 KV heads. Greedy outputs (with rejected drafts: holes in the mask)
    are the same on both paths; under "gqa" every attention call hands sdpa the KV heads (enable_gqa), under
    "sdpa" (transformers' own path, given the engine's masks) none does."""
    plain, gqa = load_pair("tiny", torch.float32), load_pair("tiny", torch.float32)
    for model in (gqa.target, gqa.draft):
        attention.apply(model, "gqa")
    cfg = GenConfig(k=k, proposer=proposer, max_new_tokens=12)
    calls = _spy(monkeypatch)
    ref, _, _ = generate(plain.target, plain.draft, PROMPTS, cfg, pad_token_id=258)
    assert calls and not any(calls)
    calls.clear()
    got, _, _ = generate(gqa.target, gqa.draft, PROMPTS, cfg, pad_token_id=258)
    assert calls and all(calls)
    assert [s.generated for s in got.seqs] == [s.generated for s in ref.seqs]
    assert all(len(s.generated) == 12 for s in got.seqs)


def test_model_cache_applies_the_configured_path_and_bad_keys_get_one_line():
    mc = harness.ModelCache("tiny", "float32", "cpu", attention="gqa")
    assert {m.config._attn_implementation for m in mc.get("none")} == {attention.NAME}
    assert harness.ModelCache("tiny", "float32", "cpu").pair.target.config._attn_implementation == "sdpa"
    cfg = dict(config.load_study("batch", "fixture"), torch={"attention": "flash"})
    with pytest.raises(SpecdecError, match="torch.attention must be one of sdpa, gqa"):
        Study.from_dict(cfg)
    with pytest.raises(ValueError, match="unknown attention path"):
        attention.apply(load_pair("tiny", torch.float32).target, "flash")


def test_the_gqa_key_is_in_the_torch_hash_only():
    cfg = dict(config.load_study("batch", "fixture"), torch={"linear": "onednn"})
    gqa = dict(cfg, torch={"linear": "onednn", "attention": "gqa"})
    assert config.config_hash(gqa, "torch") != config.config_hash(cfg, "torch")
    assert config.config_hash(gqa, "vllm") == config.config_hash(cfg, "vllm")
