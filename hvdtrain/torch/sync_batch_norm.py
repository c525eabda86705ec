"""Batch normalization with statistics computed over the batches of all ranks."""

import torch
import torch.nn.functional as F

from hvdtrain.core.horovod_api import Sum, size

from .mpi_ops import allreduce_async_, synchronize


def _sum_over_ranks(tensor):
    return synchronize(allreduce_async_(tensor, op=Sum))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        x = x.contiguous()
        channels = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, channels] + [1] * (x.dim() - 2)
        totals = _sum_over_ranks(torch.cat([x.sum(dims), x.new_tensor([x.numel() // channels])]))
        count = totals[-1]
        mean = totals[:-1] / count
        centered = x - mean.view(shape)
        # A second pass for the variance: sums of squares minus the squared mean lose precision.
        var = _sum_over_ranks((centered * centered).sum(dims)) / count
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
            running_var.mul_(1 - momentum).add_(var * (count / (count - 1)), alpha=momentum)
        normalized = centered * invstd.view(shape)
        ctx.save_for_backward(normalized, invstd, weight)
        ctx.count = count
        out = normalized
        if weight is not None:
            out = out * weight.view(shape) + bias.view(shape)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        normalized, invstd, weight = ctx.saved_tensors
        grad_output = grad_output.contiguous()
        channels = grad_output.shape[1]
        dims = [0] + list(range(2, grad_output.dim()))
        shape = [1, channels] + [1] * (grad_output.dim() - 2)
        local_sum_dy = grad_output.sum(dims)
        local_sum_dy_xhat = (grad_output * normalized).sum(dims)
        # The loss on every rank depends on this rank's inputs through the shared statistics.
        totals = _sum_over_ranks(torch.cat([local_sum_dy, local_sum_dy_xhat])) / ctx.count
        mean_dy, mean_dy_xhat = totals[:channels], totals[channels:]
        scale = invstd if weight is None else invstd * weight
        grad_input = (grad_output - mean_dy.view(shape) - normalized * mean_dy_xhat.view(shape)) * scale.view(shape)
        grad_weight = local_sum_dy_xhat if weight is not None else None
        grad_bias = local_sum_dy if weight is not None else None
        return grad_input, grad_weight, grad_bias, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Drop-in for torch.nn.BatchNorm*d whose training statistics span all ranks' batches."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        if not self.training or size() == 1:
            use_batch_stats = self.training or not self.track_running_stats
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                use_batch_stats, factor, self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, self.running_mean, self.running_var,
                                            self.eps, factor)
