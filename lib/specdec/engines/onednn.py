"""oneDNN-packed Linear layers for the torch engine on CPU (study key `linear: onednn`).

Why: through torch's default CPU matmul path (MKL sgemm, fp32) on the AMD EPYC machine a forward of a few rows
costs several one-row forwards (one 8960x1536 weight, 2 threads: ~4 ms for 1 row, ~10 ms for 4, ~14 ms for 8),
so a (k+1)-token verify is far from the one-token cost that a memory-bound decode step should have. The same
weight pre-packed once for oneDNN (`torch.ops.mkldnn._reorder_linear_weight`, as torch's inductor freezing
does for CPU) and run through `torch.ops.mkldnn._linear_pointwise` costs ~2.4 / 4.4 / 3.9 ms for 1 / 4 / 8
rows: the weight streams once per forward, as vLLM's CPU kernels do. The batch study's paired cells measure
the effect end to end (the cpu profile's earlier dense-path torch runs are kept as an older config).
"""
from __future__ import annotations

import torch

PATHS = ("dense", "onednn")


class PackedLinear(torch.nn.Module):
    """A Linear whose weight is held only in oneDNN's packed layout (same outputs up to fp rounding)."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach(), None)
        self.bias = None if lin.bias is None else torch.nn.Parameter(lin.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn packed"


def usable(model) -> str | None:
    """None if `model` can take packed Linears, else why not (one line)."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    p = next(model.parameters())
    if p.device.type != "cpu":
        return f"linear: onednn is a CPU path; the model is on {p.device.type}"
    if p.dtype != torch.float32:
        return f"linear: onednn packs fp32 weights; the model is {str(p.dtype).replace('torch.', '')}"
    return None


def pack_linears(model) -> int:
    """Replace every fp32 nn.Linear of `model` (lm_head included; a tied lm_head gets its own packed copy)
    by a PackedLinear, in place; returns how many were replaced. Raises ValueError where unusable."""
    why = usable(model)
    if why:
        raise ValueError(why)
    names = [name for name, mod in model.named_modules() if type(mod) is torch.nn.Linear]
    replace(model, names, PackedLinear)  # one layer at a time: each dense weight is freed once packed
    return len(names)


def replace(model, names: list[str], make) -> None:
    """Replace each submodule of `model` named in `names` by make(submodule), in place, one at a time."""
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, make(getattr(parent, child)))


def apply(model, path: str):
    """The model with its Linear layers on `path` ("dense": unchanged; "onednn": packed in place)."""
    if model is None or path == "dense":
        return model
    if path != "onednn":
        raise ValueError(f"unknown linear path '{path}' (one of {', '.join(PATHS)})")
    pack_linears(model)
    return model
