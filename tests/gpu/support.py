"""What the GPU tests' rank functions share (imported as `gpu.support`, like runner.support)."""

import torch

# Several ranks share the one GPU of a test machine: NCCL refuses that, so they stage through
# host memory (HOROVOD_GPU_OPERATIONS=MPI), the path for machines without NCCL.
SHARED_GPU = {"HOROVOD_GPU_OPERATIONS": "MPI"}


def gpu_of_local_rank(hvd):
    """This rank's GPU, as the runner picks it (several ranks may share one), made current."""
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device
