"""The entry point of every rank of a training job.

`hvdtrain` writes the resolved config into the run directory and starts
`python -m hvdtrain.training.worker RUN_DIR` on every rank with mpirun; rank 0 reads that config.yaml
and broadcasts it (no rank composes its own), so that only rank 0 needs the run directory: the
other hosts need no shared file system. Every rank then runs the training loop of the recipe's
framework, hvdtrain/training/train_<framework>.py, where too only rank 0 reads or writes the run
directory. When `hvdtrain` itself is started by mpirun or srun, every rank has composed the config,
and `train_in_existing_job` makes rank 0's config and run directory the run's. Before training, the
ranks agree on their device (hvdtrain/run/devices.py): a host without a GPU for each of its ranks stops a
train.device=cuda run here, on every rank, since the `hvdtrain` command cannot see other hosts.
"""

import importlib
import multiprocessing
import os
import sys
import traceback
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hvdtrain.core.exits import EXIT_CONFIG, EXIT_PREEMPTED, EXIT_RANK_ERROR, exit_status
from hvdtrain.run import devices
from hvdtrain.run.config import ConfigError, typed
from hvdtrain.run.job import launcher_rank
from hvdtrain.run.run_dir import load_run_config
from hvdtrain.run.tensorflow_startup import import_tensorflow
from hvdtrain.tasks.data import BadFile
from hvdtrain.training import fault_tolerance


def main():
    from hvdtrain import core

    run_dir = Path(sys.argv[1])
    _init_or_exit()  # the training loop's hvd.init() then finds it started and does nothing
    try:
        cfg, _ = _from_rank_0(_read_run_config(run_dir) if core.rank() == 0 else None, run_dir)
    except ConfigError as error:
        if core.rank() == 0:  # every rank has it; one says it
            print(f"hvdtrain: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)
    _train_or_exit(cfg, run_dir)


def train_in_existing_job(decided, own_dir):
    """Every rank of a job that mpirun or srun started with `hvdtrain` itself, each with a run
    directory `own_dir` of its own making: rank 0's config and run directory are the run's.
    `decided`, on rank 0 only: the config it checked and claimed its run directory for, None
    where there is nothing left to train, or the ConfigError that refused it."""
    _init_or_exit()
    cfg, run_dir = _from_rank_0(decided, own_dir)
    if own_dir != run_dir and own_dir.is_dir() and not any(own_dir.iterdir()):
        own_dir.rmdir()  # Hydra made one on this rank too, a second later than on rank 0
    if cfg is not None:
        _train_or_exit(cfg, run_dir)


def _init_or_exit():
    """hvd.init(), or this rank's exit: refused variables (HOROVOD_*, HVDTRAIN_*) in one line,
    as an error no restart mends; another failure with the status that says whether one can."""
    from hvdtrain import core

    try:
        core.init()
    except ValueError as error:
        print(f"hvdtrain: rank {launcher_rank()}: {error}", file=sys.stderr, flush=True)
        _exit_now(EXIT_CONFIG)
    except BaseException as error:
        print(f"hvdtrain: rank {launcher_rank()} could not start: {type(error).__name__}: {error}", file=sys.stderr,
              flush=True)
        _exit_now(exit_status(error))


def _from_rank_0(decided, run_dir):
    """On every rank, rank 0's (config or None, run directory), from rank 0's `decided` (its
    config, None, or a ConfigError) and `run_dir`; the other ranks' are not read. A ConfigError on
    rank 0 is raised on every rank, so that none waits for a config that will not come."""
    from hvdtrain import core

    message = None
    if core.rank() == 0:
        message = ((None, None, str(decided)) if isinstance(decided, ConfigError)
                   else (decided and OmegaConf.to_container(decided, resolve=True), str(run_dir), None))
    container, run_dir, problem = core.broadcast_object(message, root_rank=0, name="run_config")
    if problem:
        raise ConfigError(problem)
    return (typed(container) if container else None), Path(run_dir)


def _read_run_config(run_dir):
    """The run's config, or the ConfigError that says why rank 0 cannot read it."""
    path = run_dir / "config.yaml"
    try:
        return load_run_config(path)
    except (OSError, yaml.YAMLError, OmegaConfBaseException) as error:
        return ConfigError(f"rank 0 cannot read the run's config {path}: {type(error).__name__}: {error}")


def _agreed_device_or_exit(cfg):
    """The device every rank trains on (devices.agreed); a refusal comes alike on every rank, and
    rank 0 says it in one line."""
    from hvdtrain import core

    try:
        return devices.agreed(cfg)
    except ConfigError as error:
        if core.rank() == 0:
            print(f"hvdtrain: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)


def _train_or_exit(cfg, run_dir):
    device = _agreed_device_or_exit(cfg)
    fault_tolerance.watch(cfg.train.preempt_signal)
    try:
        if cfg.recipe.framework == "tensorflow":
            import_tensorflow()  # before the loop imports it, which would show its start-up noise
        loop = importlib.import_module(f"hvdtrain.training.train_{cfg.recipe.framework}")
        loop.train(cfg, run_dir, device)
    except fault_tolerance.Preempted:
        _exit_now(EXIT_PREEMPTED)
    except (BadFile, ConfigError) as error:  # the data's or the config's fault, said in one line; no restart helps
        print(f"hvdtrain: rank {launcher_rank()}: {error}", file=sys.stderr, flush=True)
        _exit_now(EXIT_CONFIG if isinstance(error, ConfigError) else EXIT_RANK_ERROR)
    except BaseException as error:
        traceback.print_exc()
        print(f"hvdtrain: rank {launcher_rank()} failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        _exit_now(exit_status(error))


def _exit_now(status):
    """Exit at once, past atexit: an orderly shutdown would wait for ranks that may be stuck in a
    collective with this one; mpirun then stops them. The status tells `hvdtrain` whether a
    restart can help. The data loader's worker processes go first: orphaned, they would live on
    until they noticed (torch's check their parent every 5 s)."""
    sys.stdout.flush()
    sys.stderr.flush()
    for child in multiprocessing.active_children():
        child.kill()
    os._exit(status)


if __name__ == "__main__":
    main()
