"""LARS, layer-wise adaptive rate scaling (You, Gitman and Ginsburg 2017, "Large Batch Training of
Convolutional Networks", arXiv:1708.03888, Algorithm 1): momentum SGD in which the step of each
layer (each parameter tensor) is scaled by its trust ratio

    lambda = eta ||w|| / (||grad L(w)|| + beta ||w||)      (eta: trust coefficient, beta: weight decay)

so that a layer moves by about the same fraction of its norm whatever the scale of its gradient:
what keeps the layers with small weights and large gradients stable at the LRs of large batches.

The LR stays out of the momentum buffer, as in torch.optim.SGD:

    v <- m v + lambda (g + beta w);   w <- w - lr v     (Nesterov: w <- w - lr (lambda (g + beta w) + m v))

where the paper writes v <- m v + lr lambda (g + beta w); w <- w - v. The two are one update while
the LR stays the same; where it changes (warmup, decay) this form is Goyal et al.'s momentum
correction, as with SGD. The buffer has SGD's name and meaning ("momentum_buffer"), so that
train_torch.py's optimizer.momentum_correction=false, which rescales it at an LR change, gives
the paper's form exactly, as it gives SGD's uncorrected one.

A parameter group with layer_adaptation=False takes plain momentum SGD (lambda = 1): the recipe's
optimizer.exclude_from_adaptation puts biases and BatchNorm's parameters there, as is usual.
"""

import torch
from torch.optim.optimizer import required


class LARS(torch.optim.Optimizer):
    # Every argument has a default, as hvdtrain.torch's DistributedOptimizer builds its subclass of
    # this one from the parameter groups alone (which carry the values).
    def __init__(self, params, lr=required, momentum=0.0, weight_decay=0.0, trust_coefficient=0.001,
                 nesterov=False, layer_adaptation=True):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, nesterov=nesterov,
                                      layer_adaptation=layer_adaptation))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    _update(p, self.state[p], group)
        return loss


def _update(p, state, group):
    momentum, weight_decay = group["momentum"], group["weight_decay"]
    step = p.grad.add(p, alpha=weight_decay)
    if group["layer_adaptation"]:
        step.mul_(trust_ratio(p, p.grad, weight_decay, group["trust_coefficient"]))
    if momentum:
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
        buffer = state["momentum_buffer"].mul_(momentum).add_(step)
        step = step.add(buffer, alpha=momentum) if group["nesterov"] else buffer
    p.add_(step, alpha=-group["lr"])


def trust_ratio(weight, gradient, weight_decay, trust_coefficient):
    """eta ||w|| / (||g|| + beta ||w||); 1 where either norm is 0, so that a layer at zero, or one
    without a gradient, is not held still by a ratio of 0. A tensor, left on the device (no wait)."""
    weight_norm, gradient_norm = torch.linalg.vector_norm(weight), torch.linalg.vector_norm(gradient)
    ratio = trust_coefficient * weight_norm / (gradient_norm + weight_decay * weight_norm)
    return torch.where((weight_norm > 0) & (gradient_norm > 0), ratio, torch.ones_like(ratio))
