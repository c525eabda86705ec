"""Horovod Elastic functions for the tests of the launchers that restart them (hvdtrain.ray's
elastic executor, hvdtrain.spark.run_elastic). The ranks cannot import this module: a test
registers it to travel by value (cloudpickle's register_pickle_by_value), as a driver script's
own functions do."""

import time
from pathlib import Path


def counts_steps(steps, progress=None, pause_s=0.0, ray_log=False):
    """A Horovod Elastic function of `steps` steps, each an allreduce whose exact sum says every rank
    took part, and a commit; rank 0 writes the steps done to `progress` and, with `ray_log`, logs
    (steps done, size) to the RayExecutor's callbacks. Returns (rank, size, steps done, the world
    sizes the state was trained on, in order, whether every sum was exact)."""
    import torch

    import hvdtrain.torch as hvd

    hvd.init()

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            summed = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="count").item()
            state.exact = state.exact and summed == hvd.size()
            if not state.sizes or state.sizes[-1] != hvd.size():
                state.sizes = state.sizes + [hvd.size()]
            state.step += 1
            state.commit()
            if progress and hvd.rank() == 0:
                Path(progress).write_text(str(state.step))
            if ray_log and hvd.rank() == 0:
                from hvdtrain.ray import ray_logger

                ray_logger.log((state.step, hvd.size()))
            time.sleep(pause_s)
        return hvd.rank(), hvd.size(), state.step, state.sizes, state.exact

    return train(hvd.elastic.ObjectState(step=0, sizes=[], exact=True))


def refuses_on_rank_1():
    """A Horovod Elastic function whose rank 1 raises: a bug that every restart would meet."""
    import torch

    import hvdtrain.torch as hvd

    hvd.init()

    @hvd.elastic.run
    def train(state):
        if hvd.rank() == 1:
            raise ValueError("rank 1 refuses on purpose")
        return hvd.allreduce(torch.ones(1), name="never").item()

    return train(hvd.elastic.ObjectState(step=0))


def steps_done(progress):
    """What counts_steps wrote to `progress` (a Path), 0 before it wrote."""
    try:
        return int(progress.read_text())
    except (OSError, ValueError):  # not written yet, or being written
        return 0


def when_steps_done(progress, steps, action, timeout_s=180):
    """Call `action()` once counts_steps has written `steps` to `progress` (or after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while steps_done(progress) < steps and time.monotonic() < deadline:
        time.sleep(0.05)
    action()
