"""Engine settings read from the environment, with Horovod's variable names and defaults."""

import difflib
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

MIB = 1024 * 1024

_LOG_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}


@dataclass(frozen=True)
class Settings:
    fusion_threshold_bytes: int = 128 * MIB
    cycle_time_s: float = 0.001
    cache_capacity: int = 1024
    timeline_path: Optional[str] = None
    timeline_mark_cycles: bool = False
    stall_check_enabled: bool = True
    stall_check_time_s: float = 60.0
    stall_shutdown_time_s: float = 0.0
    log_level: int = logging.WARNING
    log_hide_time: bool = False  # as Horovod's, the engine's log lines begin with the time unless hidden
    # Large buffers are pipelined in pieces of this size: MPI reduces a large buffer 2-3x faster
    # in pieces of about 1 MiB than in one call, and 1 MiB beat 4 MiB and 512 KiB
    # (docs/benchmarks.md).
    chunk_bytes: int = MIB
    # Tensors at least this large are reduced where they lie, without a copy into the
    # fusion buffer; smaller ones are packed together.
    pack_below_bytes: int = 64 * 1024
    # A framework's DistributedOptimizer submits its gradients in runs of about this many bytes
    # (0: each gradient on its own, as Horovod does); see hvdtrain/torch/optimizer.py. DDP's
    # bucket_cap_mb: on one H100 ResNet-50 trained at 0.97 of a plain loop with it and at 0.82
    # with 4 MiB, where each submission's host work delayed backward (docs/gpu.md).
    segment_bytes: int = 25 * MIB
    dynamic_process_sets: bool = False
    # HOROVOD_THREAD_AFFINITY: the core each local rank's engine thread is bound to, by local rank
    thread_affinity: Tuple[int, ...] = ()
    # How each operation moves device buffers: "NCCL", or "MPI" through pinned host memory.
    gpu_operations: Dict[str, str] = field(default_factory=lambda: dict.fromkeys(GPU_OPERATIONS, "NCCL"))


GPU_OPERATIONS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
GPU_TRANSPORTS = ("NCCL", "MPI")


# Horovod 0.28's variables that hvdtrain reads (the others of HVDTRAIN_* are its own).
IMPLEMENTED_VARIABLES = frozenset((
    "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_TIMELINE",
    "HOROVOD_TIMELINE_MARK_CYCLES", "HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_LOG_LEVEL", "HOROVOD_LOG_HIDE_TIME", "HOROVOD_DYNAMIC_PROCESS_SETS",
    "HOROVOD_THREAD_AFFINITY",
    "HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLREDUCE", "HOROVOD_GPU_ALLGATHER", "HOROVOD_GPU_BROADCAST",
    "HOROVOD_GPU_ALLTOALL", "HOROVOD_GPU_REDUCESCATTER",
    # =1: an elastic job, whose world may grow: hvdtrain.torch's DistributedOptimizer reduces
    # through the engine even in a job of one rank, as Horovod's does.
    "HOROVOD_ELASTIC",
))
# Horovod 0.28's variables (its runtime knobs, those horovodrun sets for Gloo, and those that
# choose what `pip install horovod` builds) that hvdtrain does not act on.
UNIMPLEMENTED_VARIABLES = frozenset((
    "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLGATHER",
    "HOROVOD_TORUS_ALLREDUCE", "HOROVOD_BATCH_D2D_MEMCOPIES", "HOROVOD_NUM_NCCL_STREAMS", "HOROVOD_CPU_OPERATIONS",
    "HOROVOD_GPU", "HOROVOD_CONTROLLER",
    "HOROVOD_CCL_CACHE", "HOROVOD_CCL_BGT_AFFINITY", "HOROVOD_ADASUM_MPI_CHUNK_SIZE", "HOROVOD_ADASUM_GPU",
    "HOROVOD_MPI_THREADS_DISABLE", "HOROVOD_DISABLE_GROUP_FUSION",
    "HOROVOD_DISABLE_NVTX_RANGES", "HOROVOD_ENABLE_ASYNC_COMPLETION", "HOROVOD_ENABLE_XLA_OPS",
    "HOROVOD_MPI_CXX", "HOROVOD_GLOO_IFACE", "HOROVOD_GLOO_TIMEOUT_SECONDS",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_GLOO_GLOBAL_PREFIX",
    "HOROVOD_GLOO_LOCAL_PREFIX", "HOROVOD_GLOO_CROSS_PREFIX", "HOROVOD_RANK", "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
    "HOROVOD_START_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT", "HOROVOD_MIXED_INSTALL", "HOROVOD_NCCL_HOME",
    "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB", "HOROVOD_NCCL_LINK", "HOROVOD_CUDA_HOME", "HOROVOD_CUDA_INCLUDE",
    "HOROVOD_CUDA_LIB", "HOROVOD_ROCM_HOME", "HOROVOD_BUILD_ARCH_FLAGS", "HOROVOD_BUILD_CUDA_CC_LIST",
    "HOROVOD_CMAKE", "HOROVOD_DEBUG", "HOROVOD_WITH_MPI", "HOROVOD_WITHOUT_MPI", "HOROVOD_WITH_GLOO",
    "HOROVOD_WITHOUT_GLOO", "HOROVOD_WITH_TENSORFLOW", "HOROVOD_WITHOUT_TENSORFLOW", "HOROVOD_WITH_PYTORCH",
    "HOROVOD_WITHOUT_PYTORCH", "HOROVOD_WITH_MXNET", "HOROVOD_WITHOUT_MXNET",
))


def ignored_variables(env=None):
    """One line for each HOROVOD_* variable set in `env` that hvdtrain ignores: a Horovod
    variable it does not implement, or a name Horovod does not know (with the nearest one)."""
    env = os.environ if env is None else env
    known = sorted(IMPLEMENTED_VARIABLES | UNIMPLEMENTED_VARIABLES)
    lines = []
    for name in sorted(env):
        if not name.startswith("HOROVOD_") or name in IMPLEMENTED_VARIABLES:
            continue
        if name in UNIMPLEMENTED_VARIABLES:
            lines.append(f"{name} is set but not implemented by hvdtrain; ignored")
            continue
        nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        hint = f" (did you mean {nearest[0]}?)" if nearest else ""
        lines.append(f"{name} is set but is not a Horovod 0.28 variable{hint}; ignored")
    return lines


def _number(env, name, default, cast):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a valid {cast.__name__}") from None
    if value < 0:
        raise ValueError(f"environment variable {name}={raw!r} must not be negative")
    return value


def _transport(env, name, default):
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if raw.upper() not in GPU_TRANSPORTS:
        raise ValueError(f"environment variable {name}={raw!r} is not one of {', '.join(GPU_TRANSPORTS)}")
    return raw.upper()


def gpu_operations(env):
    """The transport of device buffers for each operation: HOROVOD_GPU_OPERATIONS for all,
    HOROVOD_GPU_<OPERATION> for one (NCCL by default)."""
    everything = _transport(env, "HOROVOD_GPU_OPERATIONS", "NCCL")
    return {op: _transport(env, f"HOROVOD_GPU_{op.upper()}", everything) for op in GPU_OPERATIONS}


def thread_affinity(env):
    """HOROVOD_THREAD_AFFINITY: core ids separated by commas, one for each local rank."""
    raw = env.get("HOROVOD_THREAD_AFFINITY", "").strip()
    if not raw:
        return ()
    try:
        cores = tuple(int(core) for core in raw.split(","))
        valid = min(cores) >= 0
    except ValueError:
        valid = False
    if not valid:
        raise ValueError(f"environment variable HOROVOD_THREAD_AFFINITY={raw!r} is not a list of core ids "
                         f"separated by commas, one for each local rank")
    return cores


def _flag(env, name):
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def from_environment(env=None) -> Settings:
    env = os.environ if env is None else env
    level_name = env.get("HOROVOD_LOG_LEVEL", "warning").strip().lower()
    if level_name not in _LOG_LEVELS:
        raise ValueError(
            f"environment variable HOROVOD_LOG_LEVEL={level_name!r} is not one of {sorted(_LOG_LEVELS)}"
        )
    chunk_bytes = _number(env, "HVDTRAIN_CHUNK_BYTES", Settings.chunk_bytes, int)
    if chunk_bytes == 0:
        raise ValueError("environment variable HVDTRAIN_CHUNK_BYTES must be positive")
    timeline_path = env.get("HOROVOD_TIMELINE") or None
    if timeline_path is not None:
        folder = os.path.dirname(os.path.abspath(timeline_path))
        if not os.path.isdir(folder):
            raise ValueError(f"environment variable HOROVOD_TIMELINE={timeline_path!r}: folder {folder} does not exist")
    return Settings(
        fusion_threshold_bytes=_number(env, "HOROVOD_FUSION_THRESHOLD", Settings.fusion_threshold_bytes, int),
        cycle_time_s=_number(env, "HOROVOD_CYCLE_TIME", 1.0, float) / 1000.0,
        cache_capacity=_number(env, "HOROVOD_CACHE_CAPACITY", Settings.cache_capacity, int),
        timeline_path=timeline_path,
        timeline_mark_cycles=_flag(env, "HOROVOD_TIMELINE_MARK_CYCLES"),
        stall_check_enabled=not _flag(env, "HOROVOD_STALL_CHECK_DISABLE"),
        stall_check_time_s=_number(env, "HOROVOD_STALL_CHECK_TIME_SECONDS", Settings.stall_check_time_s, float),
        stall_shutdown_time_s=_number(
            env, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", Settings.stall_shutdown_time_s, float
        ),
        log_level=_LOG_LEVELS[level_name],
        log_hide_time=_flag(env, "HOROVOD_LOG_HIDE_TIME"),
        chunk_bytes=chunk_bytes,
        pack_below_bytes=_number(env, "HVDTRAIN_PACK_BELOW_BYTES", Settings.pack_below_bytes, int),
        segment_bytes=_number(env, "HVDTRAIN_SEGMENT_BYTES", Settings.segment_bytes, int),
        dynamic_process_sets=_flag(env, "HOROVOD_DYNAMIC_PROCESS_SETS"),
        gpu_operations=gpu_operations(env),
        thread_affinity=thread_affinity(env),
    )
