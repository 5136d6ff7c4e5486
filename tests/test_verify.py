"""The verifier is a pure function of logits and proposals."""
import torch

from specdec.engines import verify


def _logits(best: list[list[int]], vocab: int = 8) -> torch.Tensor:
    """Target logits (b, k+1, vocab) whose argmax at each position is best[b][i]."""
    out = torch.zeros(len(best), len(best[0]), vocab)
    for b, row in enumerate(best):
        for i, tok in enumerate(row):
            out[b, i, tok] = 5.0
    return out


def test_greedy_accepts_the_matching_prefix_per_sequence():
    plogits = _logits([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    drafts = torch.tensor([[1, 2, 3], [1, 5, 3], [6, 2, 3]])
    n, nxt = verify.verify(plogits, drafts, torch.tensor([3, 3, 3]), None, 0.0, torch.Generator())
    assert n.tolist() == [3, 1, 0] and nxt.tolist() == [4, 2, 1]


def test_padding_beyond_the_proposed_count_is_never_accepted():
    plogits = _logits([[1, 2, 3, 4]])
    drafts = torch.tensor([[1, 2, 3]])  # the padding happens to equal the target's choice
    n, nxt = verify.verify(plogits, drafts, torch.tensor([1]), None, 0.0, torch.Generator())
    assert n.tolist() == [1] and nxt.tolist() == [2]


def test_same_generator_state_gives_the_same_sampled_result():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    plogits = torch.randn(4, 3, 8, generator=torch.Generator().manual_seed(0))
    drafts = torch.randint(0, 8, (4, 2), generator=torch.Generator().manual_seed(1))
    counts = torch.full((4,), 2)
    a = verify.verify(plogits, drafts, counts, None, 1.0, g1)
    b = verify.verify(plogits, drafts, counts, None, 1.0, g2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
