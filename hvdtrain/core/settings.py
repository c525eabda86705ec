"""Engine settings read from the environment, with Horovod's variable names and defaults."""

import logging
import os
from dataclasses import dataclass
from typing import Optional

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
    # Large buffers are pipelined in pieces of this size: MPI reduces a large buffer 2-3x faster
    # in pieces of about 1 MiB than in one call, and 1 MiB beat 4 MiB and 512 KiB (README,
    # "Benchmarks").
    chunk_bytes: int = MIB
    # Tensors at least this large are reduced where they lie, without a copy into the
    # fusion buffer; smaller ones are packed together.
    pack_below_bytes: int = 64 * 1024
    dynamic_process_sets: bool = False


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
    return Settings(
        fusion_threshold_bytes=_number(env, "HOROVOD_FUSION_THRESHOLD", Settings.fusion_threshold_bytes, int),
        cycle_time_s=_number(env, "HOROVOD_CYCLE_TIME", 1.0, float) / 1000.0,
        cache_capacity=_number(env, "HOROVOD_CACHE_CAPACITY", Settings.cache_capacity, int),
        timeline_path=env.get("HOROVOD_TIMELINE") or None,
        timeline_mark_cycles=_flag(env, "HOROVOD_TIMELINE_MARK_CYCLES"),
        stall_check_enabled=not _flag(env, "HOROVOD_STALL_CHECK_DISABLE"),
        stall_check_time_s=_number(env, "HOROVOD_STALL_CHECK_TIME_SECONDS", Settings.stall_check_time_s, float),
        stall_shutdown_time_s=_number(
            env, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", Settings.stall_shutdown_time_s, float
        ),
        log_level=_LOG_LEVELS[level_name],
        chunk_bytes=chunk_bytes,
        pack_below_bytes=_number(env, "HVDTRAIN_PACK_BELOW_BYTES", Settings.pack_below_bytes, int),
        dynamic_process_sets=_flag(env, "HOROVOD_DYNAMIC_PROCESS_SETS"),
    )
