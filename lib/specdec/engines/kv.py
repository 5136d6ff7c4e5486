"""A batched KV cache with a per-slot validity mask, so sequences can accept different numbers of tokens.

Rejected draft tokens are not copied out of the cache: their slots are marked invalid and masked out of
attention ("holes"). Positions (RoPE) come from the count of valid slots per sequence, so a sequence sees
exactly the tokens it committed, in order. `compact()` squeezes the holes out when they pile up; `merge()`
and `select()` add and drop sequences (continuous batching).
"""
from __future__ import annotations

import torch


def _layers(cache):
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RuntimeError("this transformers version has no cache.layers; pin transformers==5.19.0")
    return [layer for layer in layers if getattr(layer, "is_initialized", True) and layer.keys is not None]


def _cache_arg(model) -> str:
    """The keyword under which this transformers version's forward takes the cache: `past_key_values`
    (5.19, the version vLLM 0.32 pins) or `cache` (later 5.x releases)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class KVState:
    """One model's cache for a batch. mask: (batch, slots) bool, True where a slot holds a committed token."""

    def __init__(self, model):
        self.model = model
        self.cache_arg = _cache_arg(model)
        self.cache = None
        self.mask: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    @property
    def slots(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def lengths(self) -> torch.Tensor:
        """Committed tokens per sequence (= the next position id)."""
        return self.mask.sum(1)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, valid: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Append `tokens` (batch, q) to the cache; `valid` (batch, q) marks real tokens. Returns logits."""
        from transformers import DynamicCache

        b, q = tokens.shape
        dev = tokens.device
        if self.mask is None:
            self.mask = torch.zeros(b, 0, dtype=torch.bool, device=dev)
            self.cache = DynamicCache(config=self.model.config)
        past = self.mask.shape[1]
        positions = (self.lengths()[:, None] + valid.long().cumsum(1) - 1).clamp(min=0)
        full = torch.cat([self.mask, valid], dim=1)
        kv_idx = torch.arange(past + q, device=dev)
        q_idx = past + torch.arange(q, device=dev)
        causal = kv_idx[None, :] <= q_idx[:, None]
        own = kv_idx[None, :] == q_idx[:, None]  # every row sees itself: no all-masked row, no NaN
        attend = (full[:, None, :] & causal[None]) | own[None]
        arg = self.cache_arg
        out = self.model(input_ids=tokens, attention_mask=attend[:, None], position_ids=positions,
                         use_cache=True, logits_to_keep=1 if last_only else 0, **{arg: self.cache})
        self.cache = getattr(out, arg, None) if getattr(out, arg, None) is not None else self.cache
        self.mask = full
        return out.logits

    def invalidate(self, start: int, keep: torch.Tensor, count: int) -> None:
        """Of the `count` slots from `start`, keep the first keep[b] for sequence b; mark the rest holes."""
        if count <= 0:
            return
        offs = torch.arange(count, device=self.mask.device)
        self.mask[:, start:start + count] &= offs[None, :] < keep[:, None]

    def _apply(self, fn) -> None:
        for layer in _layers(self.cache):
            layer.keys = fn(layer.keys)
            layer.values = fn(layer.values)

    def clone(self) -> "KVState":
        """An independent copy (same model, copied cache tensors and mask)."""
        import copy

        new = KVState(self.model)
        if self.mask is not None:
            new.cache, new.mask = copy.deepcopy(self.cache), self.mask.clone()
        return new

    def holes(self) -> int:
        """Slots beyond the longest sequence: what compaction would free."""
        return self.slots - int(self.lengths().max()) if self.batch else 0

    def compact(self) -> None:
        """Move every sequence's valid slots to the right end, in order, and drop the freed columns."""
        lens = self.lengths()
        width = int(lens.max())
        order = torch.argsort(self.mask.long(), dim=1, stable=True)  # holes first, then valid in order
        idx = order[:, self.slots - width:]
        self.mask = torch.gather(self.mask, 1, idx)
        self._apply(lambda t: torch.gather(t, 2, idx[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])))

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the sequences at `rows`."""
        self.mask = self.mask[rows]
        self._apply(lambda t: t[rows])

    def _left_pad(self, width: int) -> None:
        pad = width - self.slots
        if pad <= 0:
            return
        self.mask = torch.cat([self.mask.new_zeros(self.batch, pad), self.mask], dim=1)
        self._apply(lambda t: torch.cat([t.new_zeros(t.shape[0], t.shape[1], pad, t.shape[3]), t], dim=2))

    def merge(self, other: "KVState") -> None:
        """Append the sequences of `other` (same model) after ours, left-padding the shorter cache."""
        if self.mask is None or self.batch == 0:
            self.cache, self.mask = other.cache, other.mask
            return
        width = max(self.slots, other.slots)
        self._left_pad(width)
        other._left_pad(width)
        for mine, theirs in zip(_layers(self.cache), _layers(other.cache)):
            mine.keys = torch.cat([mine.keys, theirs.keys], dim=0)
            mine.values = torch.cat([mine.values, theirs.values], dim=0)
        self.mask = torch.cat([self.mask, other.mask], dim=0)


@torch.no_grad()
def prefill(model, prompts: list[list[int]], pad: int, device) -> tuple[KVState, torch.Tensor]:
    """A new cache holding `prompts` (left-padded to one width) and the logits after each prompt (b, vocab)."""
    kv = KVState(model)
    width = max(len(p) for p in prompts)
    toks = torch.full((len(prompts), width), pad, dtype=torch.long, device=device)
    valid = torch.zeros(len(prompts), width, dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        toks[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        valid[i, width - len(p):] = True
    return kv, kv.forward(toks, valid, last_only=True)[:, -1]
