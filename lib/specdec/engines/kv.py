"""A batched KV cache with a per-slot validity mask, so sequences can accept different numbers of tokens.

Rejected draft tokens are not copied out of the cache: their slots are marked invalid and masked out of
attention ("holes"). Positions (RoPE) come from the count of valid slots per sequence, so a sequence sees
exactly the tokens it committed, in order. `compact()` squeezes the holes out when they pile up; `merge()`
and `select()` add and drop sequences (continuous batching).
"""
from __future__ import annotations

import functools

import torch

PATHS = ("concat", "grow")  # the study key torch.kv (spec.KV_PATHS)
_ATTR = "_specdec_kv"  # set on a model by apply(): how its caches grow


def apply(model, path: str):
    """The model with its caches growing by `path`: "concat" (transformers' DynamicCache: every step
    concatenates the new K/V to the whole cache, a copy of it per layer per step) or "grow" (GrowLayer: new
    K/V written into spare capacity, the cache copied only when that runs out). Returns the model."""
    if path not in PATHS:
        raise ValueError(f"unknown kv path '{path}' (one of {', '.join(PATHS)})")
    if model is not None:
        setattr(model, _ATTR, path)
    return model


@functools.cache
def _grow_layer_class():
    """GrowLayer, built at first use (transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class GrowLayer(DynamicLayer):
        """A DynamicLayer whose keys/values are views of buffers with spare capacity along the sequence axis:
        update() writes the new tokens' K/V in place, so a decode step costs a write of its own K/V, not a copy of
        the cache (DynamicLayer's torch.cat: at bs 64 and ~224 KV tokens, 0.8 GB per step for the 1.5B
        target's 28 fp32 layers). When the buffer is full it is reallocated 1.5x larger (amortised O(1) per
        token). KVState may replace keys/values by new tensors (select, compact, merge, left pad): the next
        update finds they are not views of its buffers and adopts them (one copy)."""

        def _owns(self) -> bool:
            kb, vb = getattr(self, "_kbuf", None), getattr(self, "_vbuf", None)
            return (kb is not None and self.keys.dim() == 4 and self.keys.data_ptr() == kb.data_ptr()
                    and self.values.data_ptr() == vb.data_ptr() and self.keys.stride() == kb.stride()
                    and self.values.stride() == vb.stride() and self.keys.shape[:2] == kb.shape[:2])

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = self.keys.shape[-2] if self.keys.dim() == 4 else 0
            q = key_states.shape[-2]
            if not self._owns() or n + q > self._kbuf.shape[-2]:
                cap = n + q + max(64, (n + q) // 2)
                kb = key_states.new_empty((*key_states.shape[:2], cap, key_states.shape[-1]))
                vb = value_states.new_empty((*value_states.shape[:2], cap, value_states.shape[-1]))
                if n:
                    kb[:, :, :n] = self.keys
                    vb[:, :, :n] = self.values
                self._kbuf, self._vbuf = kb, vb
            self._kbuf[:, :, n:n + q] = key_states
            self._vbuf[:, :, n:n + q] = value_states
            self.keys, self.values = self._kbuf[:, :, :n + q], self._vbuf[:, :, :n + q]
            return self.keys, self.values

    return GrowLayer


def grow(cache) -> None:
    """Make every plain DynamicLayer of `cache` a GrowLayer, in place (other layer kinds are left as they are)."""
    from transformers.cache_utils import DynamicLayer

    for layer in getattr(cache, "layers", []):
        if type(layer) is DynamicLayer:
            layer.__class__ = _grow_layer_class()


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
            if getattr(self.model, _ATTR, "concat") == "grow":
                grow(self.cache)
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
