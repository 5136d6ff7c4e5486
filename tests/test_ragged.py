"""Ragged verify (config `torch: {verify: ragged}`): the target's Linears multiply only the tokens each sequence
really verifies; greedy tokens are the padded verify's."""
import pytest
import torch

from specdec.data import config
from specdec.data.models import load_pair
from specdec.data.spec import Study
from specdec.engines import harness, onednn, ragged
from specdec.engines.engine import GenConfig, generate

# the tiny target repeats the first prompt's token for a while (the lookup matches there), the others never
# match: steps where one sequence proposes 1-3 tokens and two propose nothing
PROMPTS = [[7, 7, 7, 7, 7, 7], [9, 8, 7], [5, 17, 99, 3, 44]]


def _rows(monkeypatch):
    """Rows each RaggedLinear call of the target's first MLP up-projection multiplies."""
    seen, real = [], ragged.RaggedLinear.forward

    def spy(self, x):
        out = real(self, x)
        if getattr(self, "_spied", False):
            rows = ragged._STATE.rows
            seen.append(x.shape[:-1].numel() if rows is None or x.shape[:-1].numel() != ragged._STATE.total
                        else rows.numel())
        return out

    monkeypatch.setattr(ragged.RaggedLinear, "forward", spy)
    return seen


@pytest.mark.parametrize("linear", ["dense", "onednn"])
def test_ragged_verify_gives_the_padded_verifys_greedy_tokens_multiplying_fewer_rows(monkeypatch, linear):
    pair, ref_pair = load_pair("tiny", torch.float32), load_pair("tiny", torch.float32)
    onednn.apply(pair.target, linear)
    onednn.apply(ref_pair.target, linear)
    ref, _, _ = generate(ref_pair.target, None, PROMPTS, GenConfig(k=4, proposer="ngram", max_new_tokens=24,
                                                                    verify="k"), pad_token_id=258)
    seen = _rows(monkeypatch)
    cfg = GenConfig(k=4, proposer="ngram", max_new_tokens=24, verify="ragged")
    eng, _, _ = generate(pair.target, None, PROMPTS, cfg, pad_token_id=258)
    assert ragged.wrapped(pair.target) == ragged.wrapped(ref_pair.target) + len(
        [m for m in ref_pair.target.modules() if type(m) in (torch.nn.Linear, onednn.PackedLinear)])
    assert [s.generated for s in eng.seqs] == [s.generated for s in ref.seqs]
    assert all(len(s.generated) == 24 for s in eng.seqs)
    # the first MLP up-projection: its rows per verify are each sequence's pending token + real proposals
    up = pair.target.model.layers[0].mlp.up_proj
    assert isinstance(up, ragged.RaggedLinear)
    up._spied = True
    seen.clear()
    eng, _, _ = generate(pair.target, None, PROMPTS, cfg, pad_token_id=258)
    per_step = seen[1:]  # the prefill first
    assert per_step == [sum(1 + p for p in st["proposed"]) for st in eng.steps]
    assert sum(per_step) < sum(len(PROMPTS) * (1 + max(st["proposed"])) for st in eng.steps)
    assert ragged._STATE.rows is None  # the context is left


def test_a_ragged_linear_is_its_linear_outside_and_zeroes_padded_rows_inside():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 5)
    wrapped = ragged.RaggedLinear(lin)
    x = torch.randn(3, 4, 8)
    assert torch.equal(wrapped(x), lin(x))
    valid = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    with ragged.only(valid):
        got = wrapped(x)
        assert torch.equal(wrapped(x[:, :1]), lin(x[:, :1]))  # another shape (a cut lm_head input): dense
    assert torch.allclose(got[valid], lin(x)[valid], atol=1e-6)
    assert (got[~valid] == 0).all()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    ragged.apply(model)
    ragged.apply(model)  # idempotent
    assert ragged.wrapped(model) == 2 and isinstance(model[0].inner, torch.nn.Linear)


def test_draft_model_cells_are_unchanged_and_the_key_is_hashed_for_torch_only():
    pair = load_pair("tiny", torch.float32)
    out = {}
    for width in ("k", "ragged"):
        eng, _, _ = generate(pair.target, pair.draft, PROMPTS, GenConfig(k=3, proposer="draft", max_new_tokens=8,
                                                                          verify=width), pad_token_id=258)
        out[width] = [s.generated for s in eng.seqs]
    assert out["k"] == out["ragged"]
    cfg = config.load_study("batch", "fixture")
    st = Study.from_dict(dict(cfg, torch={"verify": "ragged"}))
    assert harness.gen_config(st, {"batch": 1, "k": 3, "proposer": "ngram"}).verify == "ragged"
    rag = dict(cfg, torch={"verify": "ragged"})
    assert config.config_hash(rag, "torch") != config.config_hash(dict(cfg, torch={"verify": "proposed"}), "torch")
    assert config.config_hash(rag, "vllm") == config.config_hash(cfg, "vllm")


def test_stepprofile_interleaves_padded_and_ragged_with_the_same_tokens():
    from types import SimpleNamespace

    from specdec.engines import stepprofile
    pair = load_pair("tiny", torch.float32)
    with torch.no_grad():
        out = stepprofile.verify_widths(pair.target, SimpleNamespace(pad_token_id=258), PROMPTS, 4, 12, pairs=2,
                                        arms=("k", "ragged"))
    assert list(out["verify"]) == ["k", "ragged", "ragged", "k"]
    assert out["same"].all()
    rag, pad = out[out["verify"] == "ragged"], out[out["verify"] == "k"]
    assert (pad["rows"] == 5).all() and (rag["rows"] < rag["columns"]).all() and (rag["columns"] <= 5).all()


def test_with_the_gqa_attention_path_and_sampling():
    """The staged cpu setting (attention gqa + ragged verify): greedy tokens equal the padded verify's; a sampled
    run (rejection sampling reads the zeroed padded rows' logits only under its live mask) gives every token."""
    from specdec.engines import attention
    pair, ref_pair = load_pair("tiny", torch.float32), load_pair("tiny", torch.float32)
    for p in (pair, ref_pair):
        attention.apply(p.target, "gqa")
    ref, _, _ = generate(ref_pair.target, None, PROMPTS, GenConfig(k=3, proposer="ngram", max_new_tokens=20),
                         pad_token_id=258)
    got, _, _ = generate(pair.target, None, PROMPTS, GenConfig(k=3, proposer="ngram", max_new_tokens=20,
                                                                verify="ragged"), pad_token_id=258)
    assert [s.generated for s in got.seqs] == [s.generated for s in ref.seqs]
    hot, _, _ = generate(pair.target, None, PROMPTS, GenConfig(k=3, proposer="ngram", max_new_tokens=20,
                                                                temperature=0.8, verify="ragged"), pad_token_id=258)
    assert all(len(s.generated) == 20 and all(0 <= t < 259 for t in s.generated) for s in hot.seqs)
