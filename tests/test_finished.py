"""Finished sequences of a static batch (config `torch: {finished: keep|retire}`): under retire a sequence that has
all its tokens leaves the batch, as vLLM's scheduler drops a finished request; greedy tokens are unchanged."""
from types import SimpleNamespace

import pytest
import torch

from specdec.data import config
from specdec.data.models import load_pair
from specdec.data.spec import Study
from specdec.engines import attention, harness
from specdec.engines.engine import GenConfig, generate

# the tiny target repeats the first prompt's token for a while, so its n-gram lookup accepts and it finishes
# steps before the two others, which never match
PROMPTS = [[7, 7, 7, 7, 7, 7], [9, 8, 7], [5, 17, 99, 3, 44]]


@pytest.mark.parametrize("verify,attn", [("k", "sdpa"), ("ragged", "gqa")])
def test_retired_sequences_leave_the_batch_and_the_greedy_tokens_stay(verify, attn):
    pair = load_pair("tiny", torch.float32)
    attention.apply(pair.target, attn)
    plain, _, _ = generate(pair.target, None, PROMPTS, GenConfig(k=0, proposer="none", max_new_tokens=24), pad_token_id=258)
    out = {}
    for rule in ("keep", "retire"):
        cfg = GenConfig(k=4, proposer="ngram", max_new_tokens=24, verify=verify, finished=rule)
        out[rule], _, _ = generate(pair.target, None, PROMPTS, cfg, pad_token_id=258)
    keep, retire = out["keep"], out["retire"]
    want = [s.generated for s in plain.seqs]
    assert [s.generated for s in keep.requests] == want == [s.generated for s in retire.requests]
    assert [s.rid for s in retire.requests] == [0, 1, 2] and all(len(s.generated) == 24 for s in retire.requests)
    assert {r["batch"] for r in keep.steps} == {3}  # kept: as wide at the last step as at the first
    widths = [r["batch"] for r in retire.steps]
    assert widths[0] == 3 and min(widths) < 3 and widths == sorted(widths, reverse=True)
    assert all(all(r["active"]) for r in retire.steps)  # no step computes a finished sequence
    assert not all(all(r["active"]) for r in keep.steps)
    assert len(retire.steps) == len(keep.steps)  # the slowest sequence sets the step count either way
    assert retire.retired and len(retire.seqs) + len(retire.retired) == 3


def test_draft_model_and_sampled_runs_complete_every_sequence():
    pair = load_pair("tiny", torch.float32)
    plain, _, _ = generate(pair.target, None, PROMPTS, GenConfig(k=0, proposer="none", max_new_tokens=12), pad_token_id=258)
    drafted, _, _ = generate(pair.target, pair.draft, PROMPTS,
                             GenConfig(k=3, proposer="draft", max_new_tokens=12, finished="retire"), pad_token_id=258)
    assert [s.generated for s in drafted.requests] == [s.generated for s in plain.seqs]
    hot, _, _ = generate(pair.target, pair.draft, PROMPTS, GenConfig(k=3, proposer="draft", max_new_tokens=12,
                                                                      temperature=0.8, finished="retire"),
                         pad_token_id=258)
    assert [len(s.generated) for s in hot.requests] == [12, 12, 12]
    assert all(0 <= t < 259 for s in hot.requests for t in s.generated)


def test_run_static_records_every_request_under_retire():
    pair = load_pair("tiny", torch.float32)
    st = Study.from_dict(dict(config.load_study("batch", "fixture"), torch={"finished": "retire"},
                              generation={"max_new_tokens": 16}))
    plist = [{"ids": p, "prompt_set": "x", "prompt_idx": i} for i, p in enumerate(PROMPTS)]
    tok = SimpleNamespace(eos_token_id=None, pad_token_id=258)
    reqs, steps, batches = harness.run_static(st, {"batch": 3, "k": 4, "proposer": "ngram", "temperature": 0.0},
                                              pair.target, None, plist, tok)
    assert sorted({r["prompt_idx"] for r in reqs}) == [0, 1, 2]
    assert all(b["new_tokens"] == 3 * 16 for b in batches)
    assert min(r["batch"] for r in steps) < 3


# the key's config path (gen_config, hash, one-line errors): tests/test_verify_width.py, parametrized by key
