"""Broadcasting model and optimizer state, and arbitrary Python objects."""

import torch

from hvdtrain import core
from hvdtrain.core import global_process_set

from .mpi_ops import broadcast_async_, synchronize


def broadcast_parameters(params, root_rank, prefix=None):
    """Overwrite `params` (a state_dict, or a list of tensors or (name, tensor) pairs) with
    their values on `root_rank`, in place."""
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = []
    for index, (name, tensor) in enumerate(params):
        if not torch.is_tensor(tensor):
            continue
        key = f"broadcast_parameters.{name if name is not None else index}"
        if prefix is not None:
            key = f"{prefix}{key}"
        target = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
        if target.is_contiguous():
            handles.append((broadcast_async_(target, root_rank, key), None, None))
        else:
            staged = target.contiguous()
            handles.append((broadcast_async_(staged, root_rank, key), target, staged))
    for handle, target, staged in handles:
        synchronize(handle)
        if target is not None:
            target.copy_(staged)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Make every rank's optimizer state (per-parameter state and hyperparameters) equal to
    `root_rank`'s. `model` tells which parameters have sparse gradients (its
    nn.Embedding(sparse=True) modules)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _zero_gradients(optimizer, _sparse_parameters(model))
    state = broadcast_object(optimizer.state_dict(), root_rank, name="broadcast_optimizer_state")
    if core.rank() != root_rank:
        optimizer.load_state_dict(state)


def _sparse_parameters(model):
    if model is None:
        return set()
    return {p for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}


def _zero_gradients(optimizer, sparse_parameters):
    """Horovod initializes a fresh optimizer's state with a step on zero gradients, and scripts
    written for it rely on the zero gradients left in p.grad (e.g. torch.empty_like(p.grad)).
    We leave the same gradients, without the step, which would move the weights (weight decay)
    and count a step that no data made. They are sparse where the optimizer (SparseAdam) or
    the model's sparse embeddings need it; a DistributedOptimizer's dense ones are views into
    its gradient buckets."""
    buckets = getattr(optimizer, "_buckets", None)
    views = {} if buckets is None else buckets.view
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            if isinstance(optimizer, torch.optim.SparseAdam) or p in sparse_parameters:
                p.grad = torch.zeros_like(p).to_sparse()
            elif p in views:
                p.grad = views[p].zero_()
            else:
                p.grad = torch.zeros_like(p)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Return `root_rank`'s `obj` on every rank (serialized with cloudpickle)."""
    return core.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Return the list of every rank's `obj`, in rank order."""
    return core.allgather_object(obj, name, process_set)
