"""The `hvdtrain` command.

It composes the config once (Hydra: hvdtrain/conf/, whose group `recipe` holds the recipes),
checks it, derives the plan, writes the resolved config.yaml into the run directory, and then
either trains in this process (when it already is a rank of an mpirun or srun job), submits it as
a Slurm batch job (launcher=slurm: slurm.py), or starts the workers with mpirun (or srun) and
restarts them after failures that a restart can fix (supervisor.py); rank 0 loads that
config.yaml and broadcasts it, and no worker composes its own. Inside a Slurm job the run
directory is named by the job, and a requeued job resumes its run. `hvdtrain ls` and
`hvdtrain cp` list the recipes and copy one (recipes.py).
"""

import json
import os
import shlex
import signal
import sys
from pathlib import Path

import hydra
from hydra._internal.utils import get_args_parser as hydra_args_parser  # hydra.main's own: flags read alike
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from hvdtrain.runner import cluster, devices, hydra_errors, launcher, recipes, slurm, supervisor
from hvdtrain.runner.config import (CONF_DIR, PROGRESS_BAR_VARIABLE, RESUMABLE_KEYS, ConfigError, claim_run_dir,
                                    load_run_config, progress_bar_wanted, register_configs, register_layouts,
                                    validate)
from hvdtrain.runner.plan import make_plan
from hvdtrain.training import checkpoint
from hvdtrain.training.lr_schedule import DECAYS_TO_THE_END

# Overrides that may come with resume=RUN_DIR (train.epochs extends the run, train.device moves
# it); anything else would silently not apply.
EXTEND_OVERRIDE, MOVE_OVERRIDE = (f"{key}=" for key in RESUMABLE_KEYS)  # train.epochs=, train.device=
RESUME_OVERRIDES = ("resume=", "dry_run=", "hydra.", EXTEND_OVERRIDE, MOVE_OVERRIDE)


def main():
    if sys.argv[1:2] and sys.argv[1] in recipes.SUBCOMMANDS:
        recipes.main(sys.argv[1:])
        return
    register_configs()
    register_run_dir_resolver()
    _hydra_main()


def register_run_dir_resolver():
    """hydra.run.dir: a resumed run continues in its own directory, a new one gets a fresh one,
    named by its Slurm job where it runs inside one (slurm.py), else by the time."""
    OmegaConf.register_new_resolver(
        "run_dir", lambda resume, parent, time: resume or f"{parent}/{slurm.job_run_name() or time}", replace=True)


def _hydra_main():
    """Hydra composes the config (once, or once per job of a sweep) and calls _run_hydra_job; its
    errors, like ours, end in one line and exit status 2 (see hydra_errors)."""
    try:
        with hydra_errors.reported_as_config_errors():
            args = hydra_args_parser().parse_args()
            hydra_errors.refuse_unknown_keys(args.overrides, config_dir=args.config_dir)
            register_layouts(args.overrides, config_dir=args.config_dir)
            added = slurm.submitit_defaults(args.overrides)
            if added:  # right after the user's overrides: argparse takes them as one run of words
                after = len(sys.argv) - sys.argv[::-1].index(args.overrides[-1])
                sys.argv[after:after] = added
            _run_hydra_job()
    except ConfigError as error:
        print(f"hvdtrain: {error}", file=sys.stderr)
        sys.exit(2)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _run_hydra_job(cfg):
    hydra_errors.job_started()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run(cfg, run_dir)
    except ConfigError as error:
        print(f"hvdtrain: {error}", file=sys.stderr)
        _remove_if_empty(run_dir)
        sys.exit(2)


def run(cfg, run_dir):
    if cluster.inside_existing_job() and not (cfg.dry_run or cfg.profile):
        from hvdtrain.runner import worker

        # Rank 0's config and run directory are the run's; the ranks check their devices together
        worker.train_in_existing_job(lambda: _checked_config(cfg, run_dir), run_dir)
        return
    cfg = _checked_config(cfg, run_dir)
    if cfg is None:
        return
    if cfg.profile:
        from hvdtrain.runner import profiling  # torch: only for a profile

        profiling.profile(cfg)
        _remove_if_empty(run_dir)
        return
    if cfg.dry_run:
        from hvdtrain.runner import prediction  # the model's gradient sizes need torch: only for a dry run

        if cfg.launcher == "slurm":
            print(slurm.batch_script(cfg, run_dir, _resume_command(run_dir)), end="")
        else:
            plan = _launch_plan(cfg, run_dir)[0]
            print(json.dumps({**plan.as_json(), **prediction.predict(cfg, plan.device)}))
        _remove_if_empty(run_dir)
        return
    if cfg.launcher == "slurm":
        _submit(cfg, run_dir)
        return
    plan, environment = _launch_plan(cfg, run_dir)
    claim_run_dir(cfg, run_dir)
    print(f"hvdtrain: starting {plan.world_size} workers: {shlex.join(plan.launch_command)}", flush=True)
    # A scheduler's SIGTERM stops the workers too, and so does SIGINT where the shell started us in
    # the background, which leaves SIGINT ignored
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, signal.default_int_handler)
    try:
        status = supervisor.supervise(cfg, run_dir, plan, environment, relaunch=lambda cfg: _launch_plan(cfg, run_dir))
    except KeyboardInterrupt:
        print(f"\nhvdtrain: interrupted; continue with: hvdtrain resume={run_dir}", file=sys.stderr)
        sys.exit(130)
    if status:
        sys.exit(status)


def _checked_config(cfg, run_dir):
    """The config this run trains with: the saved one of a resumed or requeued run (None where that
    run has finished), checked; ConfigError where it cannot run."""
    if cfg.resume:
        cfg = _resumed_config(cfg)
    elif slurm.requeued() and (run_dir / "config.yaml").is_file():
        cfg = _requeued_config(cfg, run_dir)
    if cfg is None:
        return None
    validate(cfg)
    progress_bar_wanted(os.environ)  # refuses a bad value of the user's before anything launches
    return cfg


def _requeued_config(composed, run_dir):
    """Slurm started this job again (a requeue or a node failure) and the run it began is in
    `run_dir`: that run goes on from its newest checkpoint, as resume=RUN_DIR would."""
    cfg = load_run_config(run_dir / "config.yaml")
    if checkpoint.compatibility_hash(cfg) != checkpoint.compatibility_hash(composed):
        raise ConfigError(f"Slurm job {os.environ['SLURM_JOB_ID']} was started again, but its run {run_dir} was "
                          f"started with another config than this command composes; continue it with "
                          f"resume={run_dir}, or give another hydra.run.dir")
    cfg.resume = str(run_dir)
    print(f"hvdtrain: Slurm job {os.environ['SLURM_JOB_ID']} started again (SLURM_RESTART_COUNT="
          f"{os.environ['SLURM_RESTART_COUNT']}): resuming {run_dir}", flush=True)
    return None if _finished(run_dir, cfg) else cfg


def _resume_command(run_dir):
    return [sys.executable, "-m", "hvdtrain.runner.cli", f"resume={run_dir.resolve()}"]


def _submit(cfg, run_dir):
    """launcher=slurm: this run's directory, with its config, and its batch job in Slurm's queue.
    The job runs the saved config with launcher=local: it starts the ranks in its allocation."""
    cfg.launcher = "local"
    claim_run_dir(cfg, run_dir)
    job = slurm.submit(cfg, run_dir, _resume_command(run_dir))
    print(f"hvdtrain: submitted Slurm job {job}: {cfg.cluster.num_hosts * cfg.cluster.slots} workers on "
          f"{cfg.cluster.num_hosts} nodes; "
          f"run directory {run_dir} (batch script {run_dir / slurm.BATCH_SCRIPT}, output "
          f"{run_dir}/slurm-{job}.out)", flush=True)


def _launch_plan(cfg, run_dir):
    """The plan and the workers' environment; ConfigError where the hosts, or this machine's
    devices, cannot carry the run (in a dry run, only where the hosts cannot)."""
    hosts = cluster.resolve_hosts(cfg.cluster, dry_run=cfg.dry_run)
    device = devices.planned(cfg, hosts, dry_run=cfg.dry_run)
    environment = launcher.worker_environment(cfg.cluster.slots)
    environment.setdefault(PROGRESS_BAR_VARIABLE, "1" if sys.stderr.isatty() else "0")
    program = [sys.executable, "-u", "-m", "hvdtrain.runner.worker", str(run_dir.resolve())]
    if cfg.cluster.launcher == "srun":
        if "SLURM_JOB_ID" not in os.environ and not cfg.dry_run:
            raise ConfigError("cluster.launcher=srun starts the ranks as a step of a Slurm job: run inside an "
                              "allocation (salloc, sbatch, launcher=slurm), or use cluster.launcher=mpirun")
        command = slurm.srun_command(program, hosts)
    else:
        command = launcher.mpirun_command(program, hosts, env=environment, extra_args=list(cfg.cluster.mpirun_args))
    return make_plan(cfg, hosts, device, command), environment


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


def _resumed_config(requested):
    """The saved config of the run `requested.resume`, with the train.epochs and train.device of
    `requested` where the command line gives them (claim_run_dir writes them into the run's
    config.yaml once the run may start), or None when the run has finished and there is nothing
    to resume."""
    run_dir = Path(requested.resume)
    cfg = _saved_config(run_dir, dry_run=requested.dry_run)
    overrides = HydraConfig.get().overrides.task
    extending = any(o.startswith(EXTEND_OVERRIDE) for o in overrides)
    if not extending and _finished(run_dir, cfg):
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


def _epochs_done(run_dir):
    """How far a run got: its newest valid checkpoint's epoch count."""
    newest = checkpoint.newest_metadata(run_dir / "checkpoints")
    return newest["epoch"] if newest else 0


def _finished(run_dir, cfg):
    """Whether the run in `run_dir` has trained all its epochs (and says so)."""
    if _epochs_done(run_dir) < cfg.train.epochs:
        return False
    print(f"hvdtrain: {run_dir} finished all {cfg.train.epochs} epochs; nothing to resume "
          f"(extend it with resume={run_dir} train.epochs=M)", flush=True)
    return True


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
