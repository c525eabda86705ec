"""The `hvdtrain` command.

It composes the config once (Hydra: compose.py), checks it, derives the plan, writes the resolved
config.yaml into the run directory, and then either trains in this process (when it already is a
rank of an mpirun or srun job: hvdtrain/training/worker.py), submits it as a Slurm batch job
(launcher=slurm: slurm.py), prints it as a Kubernetes job (launcher=kubernetes: kubernetes.py), or
starts the workers with mpirun (or srun; or mpirun on hosts a Ray cluster places,
cluster.launcher=ray: ray_placement.py) and restarts them after failures that a restart can fix
(supervisor.py); rank 0 loads that config.yaml and broadcasts
it, and no worker composes its own. A resumed run, or a Slurm job started again, continues with
its saved config (resume.py). `hvdtrain ls` and `hvdtrain cp` list the recipes and copy one
(recipes.py).
"""

import os
import shlex
import signal
import sys
import time
from pathlib import Path

import hydra
from hydra._internal.utils import get_args_parser as hydra_args_parser  # hydra.main's own: flags read alike
from hydra.core.hydra_config import HydraConfig

from hvdtrain.core.exits import EXIT_CONFIG
from hvdtrain.launch import compose, kubernetes, mpirun, recipes, relay, resume, slurm, supervisor
from hvdtrain.launch.compose import CONF_DIR
from hvdtrain.reporting.report import record_command_time
from hvdtrain.run import devices, hosts
from hvdtrain.run.config import ConfigError, validate
from hvdtrain.run.job import (PROGRESS_BAR_VARIABLE, SUPERVISED, inside_existing_job, launcher_rank,
                              progress_bar_wanted)
from hvdtrain.run.plan import make_plan, printed
from hvdtrain.run.preemption import clear_notice
from hvdtrain.run.run_dir import claim_run_dir

# What the user waits for a run (results.json's command_time_s) counts from the command's start,
# or for a sweep's later jobs from the end of the job before.
_waiting_since = time.time()


def main():
    if sys.argv[1:2] and sys.argv[1] in recipes.SUBCOMMANDS:
        recipes.main(sys.argv[1:])
        return
    compose.register_configs()
    _hydra_main()


def _hydra_main():
    """Hydra composes the config (once, or once per job of a sweep) and calls _run_hydra_job; its
    errors, like ours, end in one line and exit status 2 (see compose.py)."""
    try:
        with compose.reported_as_config_errors():
            problem = mpirun.environment_problem(os.environ)
            if problem:
                raise ConfigError(problem)
            args = hydra_args_parser().parse_args()
            compose.refuse_unknown_keys(args.overrides, config_dir=args.config_dir)
            compose.register_layouts(args.overrides, config_dir=args.config_dir)
            added = slurm.submitit_defaults(args.overrides)
            if added:  # right after the user's overrides: argparse takes them as one run of words
                after = len(sys.argv) - sys.argv[::-1].index(args.overrides[-1])
                sys.argv[after:after] = added
            _run_hydra_job()
    except ConfigError as error:
        print(f"hvdtrain: {error}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _run_hydra_job(cfg):
    compose.job_started()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run(cfg, run_dir)
    except ConfigError as error:
        print(f"hvdtrain: {error}", file=sys.stderr)
        _remove_if_empty(run_dir)
        sys.exit(EXIT_CONFIG)


def run(cfg, run_dir):
    global _waiting_since
    if inside_existing_job() and not (cfg.dry_run or cfg.profile):
        from hvdtrain.training import worker

        # Rank 0's config and run directory are the run's: it decides, and the ranks learn its
        # decision when the job has started (and check their devices together)
        worker.train_in_existing_job(_decided_on_rank_0(cfg, run_dir) if launcher_rank() == "0" else None, run_dir)
        return
    cfg = _checked_config(cfg, run_dir)
    if cfg is None:
        return
    if cfg.profile:
        from hvdtrain.scaling import profile  # torch: only for a profile

        profile.profile(cfg)
        _remove_if_empty(run_dir)
        return
    if cfg.launcher == "kubernetes":  # the job's manifests, for kubectl apply -f -
        objects = kubernetes.manifests(cfg, HydraConfig.get().overrides.task, kubernetes.ssh_key_pair())
        print(kubernetes.printed(objects), end="")
        _remove_if_empty(run_dir)
        return
    if cfg.dry_run:
        from hvdtrain.scaling import prediction  # the model's gradient sizes need torch: only for a dry run

        if cfg.launcher == "slurm":
            print(slurm.batch_script(cfg, run_dir, _resume_command(run_dir)), end="")
        else:
            plan = _launch_plan(cfg, run_dir)[0]
            print(printed({**plan.as_json(), **prediction.predict(cfg, plan.device)}))
        _remove_if_empty(run_dir)
        return
    if cfg.launcher == "slurm":
        _submit(cfg, run_dir)
        return
    ray_hosts = None
    if cfg.cluster.launcher == "ray":
        from hvdtrain.launch.ray_placement import RayHosts  # Ray: only for a run on Ray

        ray_hosts = RayHosts(cfg.cluster)
    try:
        status = _supervised(cfg, run_dir, ray_hosts)
    finally:
        if ray_hosts is not None:
            ray_hosts.close()
    if status:
        sys.exit(status)
    waited, _waiting_since = time.time() - _waiting_since, time.time()
    record_command_time(run_dir, waited)
    print(f"hvdtrain: this run took {waited:.1f} s from the command (set-up, restarts and the report included)",
          flush=True)


def _supervised(cfg, run_dir, ray_hosts):
    """Start the workers and supervise them (supervisor.py); the exit status for `hvdtrain`."""
    plan, environment = _launch_plan(cfg, run_dir, ray_hosts)
    claim_run_dir(cfg, run_dir)
    print(f"hvdtrain: starting {plan.world_size} workers: {shlex.join(plan.launch_command)}", flush=True)
    # A scheduler's SIGTERM stops the workers too, and so does SIGINT where the shell started us in
    # the background, which leaves SIGINT ignored
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, signal.default_int_handler)

    def placed_anew(cfg):
        ray_hosts.place()
        return _launch_plan(cfg, run_dir, ray_hosts)

    try:
        return supervisor.supervise(cfg, run_dir, plan, environment, relaunch=lambda cfg: _launch_plan(cfg, run_dir),
                                    placed_anew=placed_anew if ray_hosts is not None else None)
    except KeyboardInterrupt:
        print(f"\nhvdtrain: interrupted; continue with: hvdtrain resume={run_dir}", file=sys.stderr)
        sys.exit(130)


def _checked_config(cfg, run_dir):
    """The config this run trains with: the saved one of a resumed or requeued run (None where that
    run has finished), checked; ConfigError where it cannot run."""
    if cfg.resume:
        cfg = resume.resumed_config(cfg)
    elif slurm.requeued() and (run_dir / "config.yaml").is_file():
        cfg = resume.requeued_config(cfg, run_dir)
    if cfg is None:
        return None
    validate(cfg)
    progress_bar_wanted(os.environ)  # refuses a bad value of the user's before anything launches
    return cfg


def _decided_on_rank_0(cfg, run_dir):
    """Rank 0 of a job that mpirun or srun started with `hvdtrain`: the config the run trains
    with, with `run_dir` claimed for it, None where nothing is left to train, or the ConfigError
    that refuses it (which every rank then raises)."""
    try:
        cfg = _checked_config(cfg, run_dir)
        if cfg is not None:
            claim_run_dir(cfg, run_dir)
            clear_notice(run_dir)
        return cfg
    except ConfigError as error:
        return error


def _resume_command(run_dir):
    return [sys.executable, "-m", "hvdtrain.launch.cli", f"resume={run_dir.resolve()}"]


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


def _launch_plan(cfg, run_dir, ray_hosts=None):
    """The plan and the workers' environment; ConfigError where the hosts, or this machine's
    devices, cannot carry the run (in a dry run, only where the hosts cannot). With
    cluster.launcher=ray the hosts are those `ray_hosts` placed (a dry run names them `<ray
    host0>`, ... and asks Ray nothing)."""
    environment = mpirun.worker_environment(cfg.cluster.slots)
    reach_args = []
    if ray_hosts is not None:
        job_hosts, reach_args = ray_hosts.mpirun_hosts(environment)
    elif cfg.cluster.launcher == "ray":  # a dry run
        seats = [relay.RankSeat(f"<ray host{index}>", "<relay>") for index in range(cfg.cluster.num_hosts)
                 for _ in range(cfg.cluster.slots)]
        job_hosts, reach_args = relay.relayed(seats, b"", {})
    else:
        job_hosts = hosts.resolve_hosts(cfg.cluster, dry_run=cfg.dry_run)
    device = devices.planned(cfg, job_hosts, dry_run=cfg.dry_run)
    environment.setdefault(PROGRESS_BAR_VARIABLE, "1" if sys.stderr.isatty() else "0")
    # What the supervisor tells the ranks, here so that mpirun forwards it to other hosts too
    for name, value in supervisor.worker_settings(cfg.fault).items():
        environment.setdefault(name, value)
    environment[SUPERVISED] = "1"
    program = [sys.executable, "-u", "-m", "hvdtrain.training.worker", str(run_dir.resolve())]
    if cfg.cluster.launcher == "srun":
        if "SLURM_JOB_ID" not in os.environ and not cfg.dry_run:
            raise ConfigError("cluster.launcher=srun starts the ranks as a step of a Slurm job: run inside an "
                              "allocation (salloc, sbatch, launcher=slurm), or use cluster.launcher=mpirun")
        command = slurm.srun_command(program, job_hosts)
    else:
        command = mpirun.mpirun_command(program, job_hosts, env=environment,
                                        extra_args=[*reach_args, *cfg.cluster.mpirun_args])
    return make_plan(cfg, job_hosts, device, command), environment


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
