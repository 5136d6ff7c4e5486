"""The torch engine's attention path (study key `torch: {attention: ...}`).

Why: the engine always passes an explicit mask (its masks with holes, kv.py), and with a mask transformers'
sdpa path repeats every layer's K and V out to all query heads before calling torch's sdpa (`repeat_kv`): for
Qwen2.5-1.5B (12 query heads, 2 KV heads) a copy of 6x the cache per layer per step, measured at 1.2 s of a
~1.6 s bs-32 decode step on the 2-core EPYC (stepprofile.gqa_attention: 1.21 s against 0.06 s with enable_gqa,
same outputs). "gqa" hands the KV heads to torch's sdpa in place (enable_gqa=True, the same mask): what vLLM's
CPU attention does. "sdpa" (the default) is transformers' own path, as every run before the key was measured.
"""
from __future__ import annotations

import torch

PATHS = ("sdpa", "gqa")
NAME = "specdec_sdpa_gqa"


def sdpa_gqa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
             **kwargs):
    """transformers' attention-function signature: query (batch, heads, q, dim), key/value (batch, kv_heads,
    kv, dim), attention_mask None or broadcastable to (batch, heads, q, kv) (bool: True attends). Returns
    ((batch, q, heads, dim), None)."""
    groups = getattr(module, "num_key_value_groups", 1)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, sdpa_gqa)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def apply(model, path: str):
    """The model with its attention on `path` ("sdpa": unchanged; "gqa": sdpa_gqa)."""
    if model is None or path == "sdpa":
        return model
    if path != "gqa":
        raise ValueError(f"unknown attention path '{path}' (one of {', '.join(PATHS)})")
    _register()
    model.set_attn_implementation(NAME)
    return model
