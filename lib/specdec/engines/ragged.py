"""Ragged verify for the torch engine (study key `torch: {verify: ragged}`): the target's Linears run only on the
tokens a sequence really verifies.

Why: a static batch is a (batch, width) tensor, so an n-gram step where one sequence proposed k tokens and the
others one or none still pushes batch x (k+1) rows through every Linear; on a CPU at bs 16 that is compute,
not weight streaming (stepprofile: 24 padded verify rows per bs-4 step against 13.4 that vLLM, which packs
each sequence's tokens, verifies). Here, inside `only(valid)`, every wrapped Linear gathers the valid rows
(pending token + real proposals), multiplies those, and scatters the result back into zeros; attention, norms
and the KV cache keep the padded (batch, width) shape, and the padded tokens are marked invalid in the cache
(kv.KVState holes), so no valid token attends to them. Outside `only`, a wrapped Linear is the Linear.
Greedy outputs equal the padded verify's (tests/test_ragged.py).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


class _State:
    rows: torch.Tensor | None = None  # flat indices (into batch * width) of the valid tokens
    total: int = 0  # batch * width of the forward the rows index


_STATE = _State()


class RaggedLinear(torch.nn.Module):
    """Wraps a Linear-like module (torch.nn.Linear, onednn.PackedLinear): inside `only`, it multiplies only the
    valid rows of a (batch, width, in) input; padded rows come out as zeros."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner
        self.in_features, self.out_features = inner.in_features, inner.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = _STATE.rows
        if rows is None or x.shape[:-1].numel() != _STATE.total:  # outside a verify (or a cut lm_head input)
            return self.inner(x)
        y = self.inner(x.reshape(-1, x.shape[-1]).index_select(0, rows))
        out = y.new_zeros(_STATE.total, y.shape[-1])
        out.index_copy_(0, rows, y)
        return out.view(*x.shape[:-1], y.shape[-1])


@contextmanager
def only(valid: torch.Tensor):
    """Within the block, wrapped Linears compute only the rows where `valid` (batch, width) is True."""
    _STATE.rows, _STATE.total = valid.reshape(-1).nonzero().squeeze(1), valid.numel()
    try:
        yield
    finally:
        _STATE.rows, _STATE.total = None, 0


def apply(model):
    """Wrap every Linear of `model` (lm_head included) in a RaggedLinear, in place; idempotent. Returns model."""
    from . import onednn

    linear = (torch.nn.Linear, onednn.PackedLinear)
    names = [name for name, mod in model.named_modules() if type(mod) in linear
             and not isinstance(model.get_submodule(name.rpartition(".")[0]), RaggedLinear)]
    onednn.replace(model, names, RaggedLinear)
    return model


def wrapped(model) -> int:
    """How many RaggedLinears `model` has."""
    return sum(isinstance(m, RaggedLinear) for m in model.modules())
