"""The `fault` section: what `hvdtrain` does when the job it launched fails
(hvdtrain/launch/supervisor.py): how often and when it restarts it, when a job without progress
counts as stalled, and how a job that lost hosts goes on."""

from dataclasses import dataclass
from typing import Optional

KEEP_GLOBAL_BATCH_BY = ("backward_passes", "batch_size")


@dataclass
class FaultConfig:
    max_restarts: int = 3  # restarts from the newest checkpoint after failures a restart can fix
    restart_wait_s: float = 5.0  # the wait before the first restart; it doubles with each one
    # A job without a training step for this long is stopped and restarted; the ranks' stall
    # inspector gets it as HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, to name the stalled ranks first. 0: never
    stall_shutdown_s: float = 600.0
    # Hosts that no longer answer the remote agent before a restart are left out while at least
    # this many remain (null: all are needed), and the job goes on with the same global batch:
    keep_global_batch: str = "backward_passes"  # ... by train.backward_passes_per_step, or by train.batch_size
    # where neither keeps it exactly: true trains on with the global batch the remaining ranks
    # make, at the linear rule's LR for it; false stops
    allow_rescale: bool = False
    min_hosts: Optional[int] = None


def check(cfg, problems):
    fault = cfg.fault
    problems.check(fault.max_restarts >= 0, "fault.max_restarts", "must be 0 (never restart) or more")
    problems.check(fault.restart_wait_s >= 0, "fault.restart_wait_s", "must not be negative")
    problems.check(fault.stall_shutdown_s >= 0, "fault.stall_shutdown_s", "must be 0 (never) or a number of seconds")
    problems.check(fault.keep_global_batch in KEEP_GLOBAL_BATCH_BY, "fault.keep_global_batch",
                   f"allowed: {', '.join(KEEP_GLOBAL_BATCH_BY)}")
    problems.check(fault.min_hosts is None or 1 <= fault.min_hosts <= cfg.cluster.num_hosts, "fault.min_hosts",
                   f"must be between 1 and the layout's {cfg.cluster.num_hosts} hosts, or null (all of them)")
