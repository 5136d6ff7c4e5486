"""CPU offloading, measured: a model's decoder layers keep their weights in host memory (pinned when the device
is a GPU) and copy them to the device layer by layer in every forward, freeing each after its layer ran, as
accelerate's cpu_offload does. The embedding, final norm and lm_head stay resident (for Llama-3.1-8B they are
~1 GB of its ~16 GB in bf16). Used by the hardware study's `offload` cells (harness.run_forward)."""
from __future__ import annotations

from contextlib import contextmanager

import torch


class LayerOffload:
    """Host copies of every decoder layer's tensors, taken once (pinning 16 GB takes seconds)."""

    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        pin = self.device.type == "cuda"
        self.layers = []
        for layer in model.model.layers:
            tensors = list(layer.parameters()) + list(layer.buffers())
            host = [t.detach().to("cpu", copy=True) for t in tensors]
            self.layers.append((layer, tensors, [h.pin_memory() if pin else h for h in host]))

    @contextmanager
    def active(self):
        """Inside: the layers' device tensors are freed and re-copied from host memory in each forward."""
        empty = {}
        hooks = []

        def load(tensors, host):
            def pre(module, args, kwargs=None):
                for t, h in zip(tensors, host):
                    t.data = h.to(self.device, non_blocking=True)
            return pre

        def drop(tensors):
            def post(module, args, out):
                for t in tensors:
                    t.data = empty.setdefault((t.dtype, t.device), torch.empty(0, dtype=t.dtype, device=t.device))
            return post

        for layer, tensors, host in self.layers:
            drop(tensors)(None, None, None)
            hooks += [layer.register_forward_pre_hook(load(tensors, host)),
                      layer.register_forward_hook(drop(tensors))]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            yield self.model
        finally:
            for h in hooks:
                h.remove()
            for _, tensors, host in self.layers:
                for t, h in zip(tensors, host):
                    t.data = h.to(self.device)
