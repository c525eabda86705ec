"""The `hvdtrain` command.

It composes the config once (Hydra: hvdtrain/conf/, whose group `recipe` holds the recipes), checks it, derives the plan, writes the
resolved config.yaml into the run directory, and then either trains in this process (when it
already is a rank of an mpirun or srun job) or starts the workers with mpirun; the workers load
that config.yaml and never compose their own.
"""

import json
import os
import shlex
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from hvdtrain.runner import cluster, launcher
from hvdtrain.runner.config import (CONF_DIR, PROGRESS_BAR_VARIABLE, ConfigError, claim_run_dir, load_run_config,
                             progress_bar_wanted, register_configs, validate)
from hvdtrain.runner.plan import make_plan

# Overrides that may come with resume=RUN_DIR; anything else would silently not apply.
RESUME_OVERRIDES = ("resume=", "dry_run=", "hydra.")


def main():
    register_configs()
    # hydra.run.dir: a resumed run continues in its own directory, a new one gets a fresh one.
    OmegaConf.register_new_resolver("run_dir", lambda resume, fresh: resume or fresh, replace=True)
    _hydra_main()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg):
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run(cfg, run_dir)
    except ConfigError as error:
        print(f"hvdtrain: {error}", file=sys.stderr)
        _remove_if_empty(run_dir)
        sys.exit(2)


def run(cfg, run_dir):
    if cfg.resume:
        cfg = _saved_config(Path(cfg.resume), dry_run=cfg.dry_run)
    validate(cfg)
    progress_bar_wanted(os.environ)  # refuses a bad value of the user's before anything launches
    if cfg.dry_run:
        print(json.dumps(_launch_plan(cfg, run_dir)[0].as_json()))
        _remove_if_empty(run_dir)
        return
    if cluster.inside_existing_job():
        from hvdtrain.runner import worker

        worker.train_in_existing_job(cfg, run_dir)
        return
    plan, environment = _launch_plan(cfg, run_dir)
    claim_run_dir(cfg, run_dir)
    print(f"hvdtrain: starting {plan.world_size} workers: {shlex.join(plan.launch_command)}", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a scheduler's SIGTERM stops the workers too
    try:
        result = launcher.run(plan.launch_command, env=environment)
    except KeyboardInterrupt:
        print(f"\nhvdtrain: interrupted; continue with: hvdtrain resume={run_dir}", file=sys.stderr)
        sys.exit(130)
    if result.returncode != 0:
        print(f"hvdtrain: the workers failed (mpirun exit status {result.returncode}); their errors are above. "
              f"Continue from the last checkpoint with: hvdtrain resume={run_dir}", file=sys.stderr)
        sys.exit(result.returncode)


def _launch_plan(cfg, run_dir):
    hosts = cluster.resolve_hosts(cfg.cluster)
    environment = launcher.worker_environment(cfg.cluster.slots)
    environment.setdefault(PROGRESS_BAR_VARIABLE, "1" if sys.stderr.isatty() else "0")
    program = [sys.executable, "-u", "-m", "hvdtrain.runner.worker", str(run_dir.resolve())]
    command = launcher.mpirun_command(program, hosts, env=environment, extra_args=list(cfg.cluster.mpirun_args))
    return make_plan(cfg, hosts, command), environment


def _saved_config(run_dir, dry_run):
    """The config a run was started with; resuming never re-composes it."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"resume={run_dir}: not a run directory (it has no config.yaml)")
    others = [o for o in HydraConfig.get().overrides.task if not o.startswith(RESUME_OVERRIDES)]
    if others:
        raise ConfigError(f"resume={run_dir} continues that run with its saved config.yaml; it cannot be "
                          f"combined with {' '.join(others)}")
    cfg = load_run_config(run_dir / "config.yaml")
    cfg.resume, cfg.dry_run = str(run_dir), dry_run
    return cfg


def _remove_if_empty(run_dir):
    """A dry run or a refused config trains nothing, but Hydra made its run directory (and the
    parents it needed below the working directory) all the same."""
    path = run_dir.resolve()
    while path.is_dir() and not any(path.iterdir()):
        path.rmdir()
        path = path.parent
        if Path.cwd() not in path.parents:
            break


if __name__ == "__main__":
    main()
