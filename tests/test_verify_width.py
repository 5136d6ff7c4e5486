"""The torch engine's verify width (config `torch: {verify: k|proposed}`): verify only what the n-gram lookup proposed."""
import pytest
import torch

from specdec.data import config
from specdec.data.models import load_pair
from specdec.data.spec import Study
from specdec.engines import harness, kv
from specdec.engines.engine import GenConfig, generate
from specdec.errors import SpecdecError

# the first prompt repeats itself (the lookup matches), the others do not at first (it proposes nothing)
PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [9, 8, 7], [5, 17, 99, 3, 44]]


def _widths(monkeypatch, model):
    """Token columns of every forward of `model` through the engine's caches (the prefill's included: the
    callers drop it, it is the first)."""
    seen, real = [], kv.KVState.forward

    def spy(self, tokens, valid, last_only=False):
        if self.model is model:
            seen.append(tokens.shape[1])
        return real(self, tokens, valid, last_only)

    monkeypatch.setattr(kv.KVState, "forward", spy)
    return seen


@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[2:]])
def test_proposed_width_gives_the_same_greedy_tokens_with_narrower_verifies(monkeypatch, prompts):
    pair = load_pair("tiny", torch.float32)
    seen = _widths(monkeypatch, pair.target)
    out = {}
    for width in ("k", "proposed"):
        seen.clear()
        eng, _, _ = generate(pair.target, None, prompts, GenConfig(k=4, proposer="ngram", max_new_tokens=16,
                                                                    verify=width), pad_token_id=258)
        out[width] = ([s.generated for s in eng.seqs], seen[1:],
                      [max(r["proposed"]) for r in eng.steps])
    (ref, wide, _), (got, narrow, longest) = out["k"], out["proposed"]
    assert got == ref and all(len(g) == 16 for g in got)
    assert set(wide) == {5}  # k+1 every step, whatever was proposed
    assert narrow == [m + 1 for m in longest]  # 1 + the batch's longest proposal, step by step
    assert min(narrow) < 5 and sum(narrow) < sum(wide)
    if len(prompts) == 1:
        assert 1 in narrow  # a step where the lookup found nothing is a plain one-token forward


def test_draft_model_always_verifies_k_plus_one(monkeypatch):
    pair = load_pair("tiny", torch.float32)
    seen = _widths(monkeypatch, pair.target)
    eng, _, _ = generate(pair.target, pair.draft, PROMPTS, GenConfig(k=3, proposer="draft", max_new_tokens=8,
                                                                      verify="proposed"), pad_token_id=258)
    assert set(seen[1:]) == {4} and len(seen) - 1 == len(eng.steps)


@pytest.mark.parametrize("key, value, default, bad, choices", [
    ("verify", "proposed", "k", "all", "k, proposed, ragged"),
    ("finished", "retire", "keep", "drop", "keep, retire"),  # tests/test_finished.py
])
def test_the_key_reaches_the_engine_is_hashed_for_torch_only_and_bad_values_get_one_line(key, value, default, bad,
                                                                                         choices):
    cfg = config.load_study("batch", "fixture")
    st = Study.from_dict(dict(cfg, torch={key: value}))
    cell = {"batch": 2, "k": 3, "proposer": "ngram"}
    assert getattr(harness.gen_config(st, cell), key) == value
    assert getattr(harness.gen_config(Study.from_dict(cfg), cell), key) == default
    with pytest.raises(SpecdecError, match=f"torch.{key} must be one of {choices}"):
        Study.from_dict(dict(cfg, torch={key: bad}))
    with pytest.raises(SpecdecError, match=f"{key} must be one of {choices}"):
        GenConfig(**{key: bad}).validate()
    new = dict(cfg, torch={key: value})
    assert config.config_hash(new, "torch") != config.config_hash(cfg, "torch")
    assert config.config_hash(new, "vllm") == config.config_hash(cfg, "vllm")
    assert config.config_hash(dict(cfg, torch={key: default}), "torch") != config.config_hash(new, "torch")


def test_stepprofile_times_both_widths_interleaved_with_the_same_tokens():
    from types import SimpleNamespace

    from specdec.engines import stepprofile
    pair = load_pair("tiny", torch.float32)
    with torch.no_grad():
        out = stepprofile.verify_widths(pair.target, SimpleNamespace(pad_token_id=258), PROMPTS, 4, 12, pairs=2)
    assert list(out["verify"]) == ["k", "proposed", "proposed", "k"]  # A B, B A
    assert out["same"].all() and (out["tokens"] == 3 * 12).all() and (out["decode_s"] > 0).all()
    assert (out.loc[out["verify"] == "k", "columns"] == 5).all()
    assert (out.loc[out["verify"] == "proposed", "columns"] < 5).all()
