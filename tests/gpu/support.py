"""What the GPU tests' rank functions share (imported as `gpu.support`, like runner.support)."""

import os

import torch

# Several ranks share the one GPU of a test machine, and NCCL refuses two ranks of one host on one
# device ("Duplicate GPU detected"). The tests take either way round it, each a path of its own:
# - through host memory: GPU buffers reduced through MPI (HOROVOD_GPU_OPERATIONS=MPI), the path of
#   machines without NCCL;
# - NCCL, ranks as hosts: each rank names a host of its own to NCCL (NCCL_HOSTID, which
#   gpu_of_local_rank sets), so NCCL joins the ranks as it joins ranks of different machines,
#   through its network transport over loopback sockets: NCCL's multi-node path, on one GPU.
#   What runs this way is checked for correctness only; its speed is the sockets'.
RANKS_AS_HOSTS_VARIABLE = "HVDTRAIN_TEST_RANKS_AS_HOSTS"
RANKS_AS_HOSTS = {RANKS_AS_HOSTS_VARIABLE: "1", "NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1",
                  "NCCL_SOCKET_IFNAME": "lo"}
SHARED_GPU = {"through host memory": {"HOROVOD_GPU_OPERATIONS": "MPI"}, "NCCL, ranks as hosts": RANKS_AS_HOSTS}


def gpu_of_local_rank(hvd):
    """This rank's GPU, as the runner picks it (several ranks may share one), made current; a
    rank of a job run as hosts of their own (SHARED_GPU) names its host to NCCL first, which
    reads NCCL_HOSTID when it makes a communicator, at the first collective on the GPU."""
    if os.environ.get(RANKS_AS_HOSTS_VARIABLE):
        os.environ["NCCL_HOSTID"] = f"hvdtrain-test-rank-{hvd.rank()}"
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device
