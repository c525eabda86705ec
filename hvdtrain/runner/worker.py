"""A rank of a training job.

`hvdtrain` writes the resolved config into the run directory and starts
`python -m hvdtrain.runner.worker RUN_DIR` on every rank with mpirun; each rank loads that config.yaml
(never composing its own) and runs the training loop of the recipe's framework,
hvdtrain/training/train_<framework>.py. When `hvdtrain` itself is started by mpirun or srun, every rank
has composed the config, and `train_in_existing_job` makes rank 0's config and run directory
the run's.
"""

import importlib
import os
import sys
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from hvdtrain.runner.config import ConfigError, claim_run_dir, load_run_config, typed

RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def main():
    run_dir = Path(sys.argv[1])
    _train_or_exit(load_run_config(run_dir / "config.yaml"), run_dir)


def train_in_existing_job(cfg, run_dir):
    from hvdtrain import core

    core.init()
    own_dir, claim = run_dir, None
    if core.rank() == 0:
        try:
            claim_run_dir(cfg, run_dir)
            claim = (OmegaConf.to_container(cfg, resolve=True), str(run_dir), None)
        except ConfigError as error:
            claim = (None, None, str(error))
    container, run_dir, problem = core.broadcast_object(claim, root_rank=0, name="run_config")
    if problem:
        raise ConfigError(problem)
    run_dir = Path(run_dir)
    if own_dir != run_dir and own_dir.is_dir() and not any(own_dir.iterdir()):
        own_dir.rmdir()  # Hydra made one on this rank too, a second later than on rank 0
    _train_or_exit(typed(container), run_dir)


def _train_or_exit(cfg, run_dir):
    try:
        loop = importlib.import_module(f"hvdtrain.training.train_{cfg.recipe.framework}")
        loop.train(cfg, run_dir)
    except BaseException as error:
        traceback.print_exc()
        rank = next((os.environ[name] for name in RANK_VARIABLES if name in os.environ), "0")
        print(f"hvdtrain: rank {rank} failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        # Exit at once, past atexit: an orderly shutdown would wait for ranks that may be stuck
        # in a collective with this one; mpirun then stops them.
        os._exit(1)


if __name__ == "__main__":
    main()
