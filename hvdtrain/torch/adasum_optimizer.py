"""DistributedOptimizer(op=Adasum) in a job of more than one rank: Horovod's delta optimizer.

Adasum weighs each rank's contribution by how it aligns with the others', so it needs the full
size of each rank's update, not of its gradient: each rank applies the wrapped optimizer to its
own gradients, and the ranks combine the changes of the weights (the deltas) by Adasum. As soon
as a parameter's gradient is in (after backward_passes_per_step passes), its hook steps the
wrapped optimizer for that parameter alone, from its weights at the start of the step, and
submits the delta; step() adds each combined delta to the start. The wrapped optimizer's state
(momentum, Adam's moments) stays each rank's own, as in Horovod.
"""

from functools import partial

import torch

from hvdtrain.core.horovod_api import Adasum

from .mpi_ops import allreduce_async_, synchronize


class _DistributedAdasumOptimizer:
    """Mixed in front of the wrapped optimizer's class (see optimizer.DistributedOptimizer)."""

    def __init__(self, params, parameter_names, compression, backward_passes_per_step):
        super().__init__(params)
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self._parameter_names = parameter_names  # parameter -> its name, the same on every rank
        self._requires_update = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._passes_left = {p: backward_passes_per_step for p in self._requires_update}
        self._starts = {p: torch.zeros_like(p, requires_grad=False) for p in self._requires_update}
        self._handles = {}  # parameter -> (handle, compression context), once submitted this step
        for p in self._requires_update:
            # As in Horovod: every parameter has a gradient, so that a step on one no backward
            # reached is a step of the wrapped optimizer on zeros.
            p.grad = torch.zeros_like(p)
            p.register_post_accumulate_grad_hook(partial(self._on_gradient, p))

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        self._passes_left = dict.fromkeys(self._passes_left, passes)

    def _on_gradient(self, p, _):
        if p in self._handles:
            raise AssertionError("Gradients were computed more than backward_passes_per_step times before call to "
                                 "step(). Increase backward_passes_per_step to accumulate gradients locally.")
        self._passes_left[p] -= 1
        if self._passes_left[p] == 0:
            self._handles[p] = self._submit_delta(p)

    def _submit_delta(self, p):
        """Step the wrapped optimizer on `p` alone and submit the change of its weights; `p`
        holds that delta until step()."""
        start = self._starts[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            start.copy_(p.detach())
            super().step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        with torch.no_grad():
            p.sub_(start)
        compressed, context = self._compression.compress(p.detach())
        return allreduce_async_(compressed, name=f"DistributedOptimizer.{self._parameter_names[p]}", op=Adasum), context

    def synchronize(self):
        pass

    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for p in self._requires_update:
            if p not in self._handles:  # backward did not reach it, or not often enough
                self._handles[p] = self._submit_delta(p)
        with torch.no_grad():
            for p, (handle, context) in self._handles.items():
                delta = self._compression.decompress(synchronize(handle), context)
                p.copy_(self._starts[p].add_(delta))
                self._passes_left[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, set_to_none=True):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                                 "or optimizer.synchronize(). This is prohibited as it can cause a race condition.")
        return super().zero_grad(set_to_none)
