"""Correctness of the batched SD engine on the tiny deterministic pair (fp64, so argmax ties cannot flip)."""
import numpy as np
import pytest
import torch
from scipy import stats

from specdec.data.models import load_pair
from specdec.engines.engine import GenConfig, Sequence, SpecEngine, generate
from specdec.errors import SpecdecError

PAD = 258


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny")


def mixed_prompts(n, seed=0, repeat=False):
    """n prompts of mixed lengths (3..40 tokens) from a fixed seed; `repeat` doubles each (n-gram hits)."""
    rng = np.random.default_rng(seed)
    out = [rng.integers(0, 256, size=int(rng.integers(3, 41))).tolist() for _ in range(n)]
    return [p + p for p in out] if repeat else out


def run(pair, prompts, **kw):
    eng, _, _ = generate(pair.target, pair.draft, prompts, GenConfig(**kw), pad_token_id=PAD)
    return eng


@pytest.mark.parametrize("bs,proposer,k", [(1, "draft", 1), (1, "draft", 6), (4, "draft", 3), (16, "draft", 3),
                                          (1, "ngram", 4), (4, "ngram", 4), (16, "ngram", 4)])
def test_greedy_sd_equals_target_greedy(pair, bs, proposer, k):
    prompts = mixed_prompts(bs, seed=bs, repeat=proposer == "ngram")
    base = run(pair, prompts, k=0, max_new_tokens=40)
    sd = run(pair, prompts, k=k, proposer=proposer, max_new_tokens=40, compact_after=6)
    for b, s in zip(base.seqs, sd.seqs):
        assert len(s.generated) == 40
        assert s.generated == b.generated
    accepted = sum(sum(r["accepted"]) for r in sd.steps)
    assert accepted > 0, "the tiny draft should get some tokens accepted, else the test exercises nothing"
    if proposer == "draft":  # static batching: with n-gram the slowest sequence sets the step count
        assert len(sd.steps) < len(base.steps)


def test_baseline_equals_hf_generate_per_sequence(pair):
    prompts = mixed_prompts(4, seed=7)
    base = run(pair, prompts, k=0, max_new_tokens=16)
    for p, s in zip(prompts, base.seqs):
        ids = torch.tensor([p])
        ref = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                   do_sample=False, pad_token_id=PAD)
        assert ref[0, len(p):].tolist() == s.generated


def test_k0_is_plain_decoding(pair):
    prompts = mixed_prompts(3, seed=3)
    eng = run(pair, prompts, k=0, proposer="draft", max_new_tokens=10)
    assert eng.proposer is None
    assert all(r["proposed"] == [0, 0, 0] and r["draft_s"] < 1e-3 for r in eng.steps)
    assert len(eng.steps) == 9  # first token comes from the prefill


def test_acceptance_is_per_sequence(pair):
    prompts = mixed_prompts(8, seed=11)
    eng = run(pair, prompts, k=4, max_new_tokens=20)
    per_step = [r["accepted"] for r in eng.steps]
    assert any(len(set(a)) > 1 for a in per_step), "sequences should accept different counts in one step"


def test_kv_caches_stay_consistent(pair):
    prompts = mixed_prompts(6, seed=5)
    eng = SpecEngine(pair.target, pair.draft, GenConfig(k=3, max_new_tokens=200, compact_after=4), pad_token_id=PAD)
    eng.add([Sequence(i, p, 200) for i, p in enumerate(prompts)])
    for _ in range(12):
        eng.step()
        total = torch.tensor([len(s.prompt) + len(s.generated) for s in eng.seqs])
        # target cache: everything committed except the pending last token
        assert torch.equal(eng.tkv.lengths().cpu(), total - 1)
        # draft cache: everything except its 1 or 2 pending inputs
        assert torch.equal(eng.proposer.kv.lengths().cpu(), total - 1 - eng.proposer.valid[:, 0].long().cpu())
    assert eng.tkv.holes() < 4 + 4  # compaction keeps the hole columns bounded


def test_continuous_batching_admission_keeps_outputs(pair):
    prompts = mixed_prompts(5, seed=9)
    alone = [run(pair, [p], k=0, max_new_tokens=12).seqs[0].generated for p in prompts]
    eng = SpecEngine(pair.target, pair.draft, GenConfig(k=3, max_new_tokens=12), pad_token_id=PAD)
    eng.add([Sequence(0, prompts[0], 12), Sequence(1, prompts[1], 12)])
    done, next_id = [], 2
    while eng.seqs or next_id < 5:
        if eng.seqs:
            eng.step()
            done += eng.retire()
        if next_id < 5:
            eng.add([Sequence(next_id, prompts[next_id], 12)])
            next_id += 1
    assert {s.rid: s.generated for s in done} == dict(enumerate(alone))


T = 6.0  # the tiny pair is peaky; at this temperature ~35 tokens have expected counts >= 5 out of 3000


def _chi2_pvalue(samples, probs, min_expected=5):
    """Goodness of fit of sampled tokens against exact probabilities (rare cells pooled)."""
    n = len(samples)
    counts = np.bincount(samples, minlength=len(probs))
    expected = probs * n
    big = expected >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < min_expected:
        obs, exp = obs[:-1], exp[:-1] * obs[:-1].sum() / exp[:-1].sum()
    return stats.chisquare(obs, exp).pvalue


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_sampled_sd_matches_target_distribution(pair, proposer):
    """Token 2 and 3 of sampled SD (after the prefill token) follow the target's exact distribution."""
    prompt = [100, 101, 102, 100, 101]
    n = 3000
    cfg = GenConfig(k=3, proposer=proposer, temperature=T, max_new_tokens=3, seed=1)
    eng = SpecEngine(pair.target, pair.draft, cfg, pad_token_id=PAD)
    eng.add([Sequence(i, prompt, 3) for i in range(n)])
    eng.last[:] = 101  # condition on a fixed first generated token (prefill sample overridden)
    if proposer == "draft":
        eng.proposer.pend[:, 1] = 101
    for s in eng.seqs:
        s.generated = [101]
    eng.step()
    second = np.array([s.generated[1] for s in eng.seqs])
    with torch.no_grad():
        logits = pair.target(torch.tensor([prompt + [101]])).logits[0, -1]
    p = torch.softmax(logits.double() / T, -1).numpy()
    assert (p * n >= 5).sum() > 20, "the target distribution must be spread for the test to have power"
    assert _chi2_pvalue(second, p) > 1e-3
    # the same test rejects a biased sampler: the draft's own distribution
    with torch.no_grad():
        q = torch.softmax(pair.draft(torch.tensor([prompt + [101]])).logits[0, -1].double() / T, -1).numpy()
    draft_samples = np.random.default_rng(0).choice(len(q), size=n, p=q)
    if proposer == "draft":
        assert _chi2_pvalue(draft_samples, p) < 1e-3


def test_sampled_sd_second_position_matches(pair):
    """The token after an accepted draft token is also target-distributed: check position 3 jointly."""
    prompt = [50, 60, 70]
    n = 3000
    eng = SpecEngine(pair.target, pair.draft, GenConfig(k=2, temperature=T, max_new_tokens=3, seed=2),
                     pad_token_id=PAD)
    eng.add([Sequence(i, prompt, 3) for i in range(n)])
    eng.last[:] = 65
    eng.proposer.pend[:, 1] = 65
    for s in eng.seqs:
        s.generated = [65]
    eng.step()
    pairs = [tuple(s.generated[1:3]) for s in eng.seqs if len(s.generated) >= 3]
    with torch.no_grad():
        p1 = torch.softmax(pair.target(torch.tensor([prompt + [65]])).logits[0, -1].double() / T, -1).numpy()
    top = int(np.argmax(p1))
    given = np.array([b for a, b in pairs if a == top])
    assert len(given) > 300
    with torch.no_grad():
        p2 = torch.softmax(pair.target(torch.tensor([prompt + [65, top]])).logits[0, -1].double() / T, -1).numpy()
    assert _chi2_pvalue(given, p2) > 1e-3


def test_synthetic_alpha_controls_acceptance(pair):
    prompts = mixed_prompts(8, seed=2)
    lo = run(pair, prompts, k=4, max_new_tokens=40, synthetic_alpha=0.2)
    hi = run(pair, prompts, k=4, max_new_tokens=40, synthetic_alpha=0.9)
    rate = lambda e: sum(sum(r["accepted"]) for r in e.steps) / sum(sum(r["proposed"]) for r in e.steps)
    assert rate(lo) < 0.3 < 0.6 < rate(hi)


@pytest.mark.parametrize("kw,msg", [({"k": -1}, "k must be"), ({"proposer": "magic"}, "unknown proposer"),
                                    ({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -1}, "temperature")])
def test_bad_generation_config(kw, msg):
    with pytest.raises(SpecdecError, match=msg):
        GenConfig(**kw).validate()


def test_draft_proposer_needs_draft(pair):
    with pytest.raises(SpecdecError, match="needs a draft"):
        SpecEngine(pair.target, None, GenConfig(k=2, proposer="draft"))


@pytest.mark.parametrize("k", [2, 3])
def test_hf_assisted_generation_runs_at_the_cells_k(pair, k):
    """The bench compares our SD at k with HF assisted generation at the same k: the assistant must draft
    exactly k tokens per round (its own generation_config defaults would draft up to 20)."""
    from specdec.engines import harness

    calls = []
    for name, model in (("T", pair.target), ("D", pair.draft)):
        orig = model.forward

        def spy(*a, _orig=orig, _name=name, **kw):
            calls.append(_name)
            return _orig(*a, **kw)
        model.forward = spy
    try:
        defaults = {a: getattr(pair.draft.generation_config, a, None) for a in harness.ASSISTANT_SETTINGS}
        harness.hf_generate(pair.target, pair.draft, [[5, 6, 7, 8, 9]], k, 12, PAD)
        assert {a: getattr(pair.draft.generation_config, a, None) for a in harness.ASSISTANT_SETTINGS} == defaults
    finally:
        del pair.target.forward, pair.draft.forward
    runs = "".join(calls).split("T")
    drafted = [len(r) for r in runs[:-1] if r]
    assert drafted and max(drafted) == k  # the first round may also prefill; never more than k per round
