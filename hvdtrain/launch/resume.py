"""Continuing a run: `hvdtrain resume=RUN_DIR` (which may extend it with train.epochs=N or move it
with train.device=...), and a Slurm job started again that finds the run it began.

A run is continued with the config it was started with, saved in its directory; it is never
composed again. What it may change is RESUMABLE_KEYS (hvdtrain/run/config/__init__.py); anything
else given with resume= is refused, since it would silently not apply.
"""

import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from hvdtrain.run.config import RESUMABLE_KEYS, ConfigError, validate
from hvdtrain.run.config.schedule import DECAYS_TO_THE_END
from hvdtrain.run.run_dir import load_run_config
from hvdtrain.training import checkpoint

EXTEND_OVERRIDE, MOVE_OVERRIDE = (f"{key}=" for key in RESUMABLE_KEYS)  # train.epochs=, train.device=
RESUME_OVERRIDES = ("resume=", "dry_run=", "hydra.", EXTEND_OVERRIDE, MOVE_OVERRIDE)


def requeued_config(composed, run_dir):
    """Slurm started this job again (a requeue or a node failure) and the run it began is in
    `run_dir`: that run goes on from its newest checkpoint, as resume=RUN_DIR would. None where
    it has finished."""
    cfg = load_run_config(run_dir / "config.yaml")
    if checkpoint.compatibility_hash(cfg) != checkpoint.compatibility_hash(composed):
        raise ConfigError(f"Slurm job {os.environ['SLURM_JOB_ID']} was started again, but its run {run_dir} was "
                          f"started with another config than this command composes; continue it with "
                          f"resume={run_dir}, or give another hydra.run.dir")
    cfg.resume = str(run_dir)
    print(f"hvdtrain: Slurm job {os.environ['SLURM_JOB_ID']} started again (SLURM_RESTART_COUNT="
          f"{os.environ['SLURM_RESTART_COUNT']}): resuming {run_dir}", flush=True)
    return None if finished(run_dir, cfg) else cfg


def resumed_config(requested):
    """The saved config of the run `requested.resume`, with the train.epochs and train.device of
    `requested` where the command line gives them (claim_run_dir writes them into the run's
    config.yaml once the run may start), or None when the run has finished and there is nothing
    to resume."""
    run_dir = Path(requested.resume)
    cfg = _saved_config(run_dir, dry_run=requested.dry_run)
    overrides = HydraConfig.get().overrides.task
    extending = any(o.startswith(EXTEND_OVERRIDE) for o in overrides)
    if not extending and finished(run_dir, cfg):
        return None
    if any(o.startswith(MOVE_OVERRIDE) for o in overrides) and requested.train.device != cfg.train.device:
        started_with, cfg.train.device = cfg.train.device, requested.train.device
        validate(cfg)  # before saying so
        print(f"hvdtrain: {run_dir} goes on with train.device={cfg.train.device} "
              f"(it was started with train.device={started_with})", flush=True)
    if not extending:
        return cfg
    saved, epochs, done = cfg.train.epochs, requested.train.epochs, _epochs_done(run_dir)
    if epochs <= done:
        raise ConfigError(f"train.epochs={epochs}: {run_dir} has done {done} of its {saved} epochs already; "
                          f"resume={run_dir} train.epochs=N trains on to N epochs, N more than {done}")
    cfg.train.epochs = epochs
    validate(cfg)  # before saying so
    if cfg.schedule.decay in DECAYS_TO_THE_END:
        effect = (f"its {cfg.schedule.decay} decay is stretched to end at epoch {epochs}: from epoch {done} on the "
                  f"LR follows the {epochs}-epoch curve, so the result is not that of a run started with "
                  f"train.epochs={epochs}")
    else:
        effect = (f"its {cfg.schedule.decay} schedule does not depend on train.epochs: it trains on as a run "
                  f"started with train.epochs={epochs} would")
    print(f"hvdtrain: extending {run_dir} from {saved} to {epochs} epochs; {effect}", flush=True)
    return cfg


def _saved_config(run_dir, dry_run):
    """The config a run was started with; resuming never re-composes it."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"resume={run_dir}: not a run directory (it has no config.yaml)")
    others = [o for o in HydraConfig.get().overrides.task if not o.startswith(RESUME_OVERRIDES)]
    if others:
        raise ConfigError(f"resume={run_dir} continues that run with its saved config.yaml; it cannot be "
                          f"combined with {' '.join(others)} (only train.epochs=N, which extends it, and "
                          f"train.device=..., which moves it to other hardware)")
    cfg = load_run_config(run_dir / "config.yaml")
    cfg.resume, cfg.dry_run = str(run_dir), dry_run
    return cfg


def _epochs_done(run_dir):
    """How far a run got: its newest valid checkpoint's epoch count."""
    newest = checkpoint.newest_metadata(run_dir / "checkpoints")
    return newest["epoch"] if newest else 0


def finished(run_dir, cfg):
    """Whether the run in `run_dir` has trained all its epochs (and says so)."""
    if _epochs_done(run_dir) < cfg.train.epochs:
        return False
    print(f"hvdtrain: {run_dir} finished all {cfg.train.epochs} epochs; nothing to resume "
          f"(extend it with resume={run_dir} train.epochs=M)", flush=True)
    return True
