"""`hvdtrain` watching the job it launched, and starting it again where a restart can help.

A failed job is told apart by mpirun's exit status, which is the status of the first rank that
ended abnormally (128 + the signal for one that was killed; hvdtrain/core/exits.py):
- a refused config (EXIT_CONFIG) and a Python exception on a rank (EXIT_RANK_ERROR) would meet
  the same error again: no restart;
- anything else -- a rank killed by a signal (the kernel's OOM killer, a reboot), a rank whose
  collectives failed because a peer went away or stalled (EXIT_COMMUNICATION), mpirun's own
  failure when it loses a host, mpirun exiting 0 before the run finished -- and a job that made
  no training step for `fault.stall_shutdown_s`: stop what is left of it and start it again,
  up to `fault.max_restarts` times, waiting `fault.restart_wait_s` before the first restart and
  twice as long before each next one. The ranks resume from the newest valid checkpoint as
  `hvdtrain resume=RUN_DIR` would, so a restart loses the steps since that checkpoint.

A hung job: a rank stuck in its data loader leaves its peers waiting in a collective, and the
ranks' stall inspector (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, set from `fault.stall_shutdown_s`)
names the missing rank and shuts the job down. A rank that cannot run at all (SIGSTOP, a frozen
host) stops every rank's engine, the inspector's too; so rank 0 also writes the number of its
last step into the run directory's heartbeat file after every step (and as it starts, evaluates
and finishes), and the supervisor stops the job when that file has not changed for
`fault.stall_shutdown_s` plus a grace period that leaves the inspector the first word (and
while rank 0 says it is outside training steps, for at least OUTSIDE_STEPS_S).

Every restart is appended to metrics.jsonl (event "restart": when, why, the step it resumes
from, the steps lost), from where results.json and the report take them.
"""

import copy
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List

from omegaconf import OmegaConf

from hvdtrain.core.exits import EXIT_COMMUNICATION, EXIT_PREEMPTED, NOT_RESTARTED
from hvdtrain.launch import mpirun
from hvdtrain.run import preemption
from hvdtrain.run.config import ConfigError
from hvdtrain.run.run_dir import HEARTBEAT, clear_heartbeat, last_beat, update_saved_config
from hvdtrain.training import checkpoint

LAUNCH_AGENT = "PRTE_MCA_prte_launch_agent"  # what mpirun starts its daemons with; PRRTE splits it at spaces
POLL_S = 0.5
# The least time rank 0 gets outside training steps: from the launch to its first beat, and while
# it starts, evaluates, writes the results or exits (a report's plots on a loaded machine took 8 s)
OUTSIDE_STEPS_S = 60.0
# What a smaller world changes in the run's config.yaml (resized)
RESIZED_KEYS = ("cluster.hosts", "cluster.hostfile", "cluster.num_hosts", "train.batch_size",
                "train.backward_passes_per_step")


def stall_grace_s(stall_shutdown_s):
    """How much longer than the stall inspector's limit the supervisor waits for a step."""
    return max(5.0, stall_shutdown_s / 4)


def worker_settings(fault):
    """The ranks' stall inspector settings for `fault` (a user's own HOROVOD_ variables win):
    warn of a stall as Horovod does, after 60 s, or sooner where the shutdown comes sooner."""
    if not fault.stall_shutdown_s:
        return {}
    return {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": f"{fault.stall_shutdown_s:g}",
            "HOROVOD_STALL_CHECK_TIME_SECONDS": f"{min(60.0, fault.stall_shutdown_s):g}"}


@dataclass(frozen=True)
class Outcome:
    """How one launch of the job ended: mpirun's status, or `stalled_s` where the supervisor
    stopped it for making no step that long."""
    returncode: int
    stalled_s: float = 0.0


@dataclass(frozen=True)
class Restart:
    event: str
    time: float  # seconds since the epoch
    attempt: int
    reason: str
    step: int  # the step it resumes from: the newest valid checkpoint's
    steps_lost: int  # trained since that checkpoint, trained again
    hosts_before: List[str]  # host:slots
    hosts_after: List[str]


def supervise(cfg, run_dir, plan, env, relaunch, placed_anew=None):
    """Run the job of `plan` (its launch command in the environment `env`) until it finishes or
    fails for good; returns the exit status for `hvdtrain` (0 on success). Where hosts are lost,
    `relaunch(cfg)` gives the (plan, environment) for the smaller world. Where the hosts are
    placed by an engine that replaces lost ones (Ray), `placed_anew(cfg)` gives the (plan,
    environment) on hosts placed again, before every restart, and no host is probed. Ctrl-C (and SIGTERM outside
    Slurm) stops the job and raises KeyboardInterrupt. A preemption notice (train.preempt_signal,
    and SIGTERM inside Slurm) goes on to rank 0, and the job is not restarted after it."""
    fault = cfg.fault
    restarts = 0
    preemption.clear_notice(run_dir)
    for watched in preemption.watched_signals(cfg.train.preempt_signal):
        signal.signal(watched, lambda signum, frame: preemption.post_notice(run_dir, signal.Signals(signum).name))
    while True:
        clear_heartbeat(run_dir)
        outcome = watch(plan.launch_command, env, run_dir, fault.stall_shutdown_s)
        reason = failure(outcome, run_dir, cfg)
        if reason is None:
            return 0
        status = outcome.returncode if outcome.returncode > 0 else 1  # mpirun stopped by the supervisor: < 0
        notice = preemption.posted_notice(run_dir)
        if status == EXIT_PREEMPTED or notice:
            stopped = ("stopped with a checkpoint" if status == EXIT_PREEMPTED
                       else f"ended before its ranks could checkpoint ({reason})")
            after = (f" {time.time() - notice.received_at:.1f} s after hvdtrain received {notice.signal_name}"
                     if notice else "")
            print(f"hvdtrain: preempted: the job {stopped}{after}. {resume_advice(run_dir)}", file=sys.stderr,
                  flush=True)
            return EXIT_PREEMPTED if status == EXIT_PREEMPTED else status
        if status in NOT_RESTARTED and not outcome.stalled_s:
            print(f"hvdtrain: the workers failed (mpirun exit status {status}): {NOT_RESTARTED[status]}, "
                  f"so the job is not restarted; their errors are above. {resume_advice(run_dir)}", file=sys.stderr,
                  flush=True)
            return status
        if restarts >= fault.max_restarts:
            print(f"hvdtrain: {reason}; restarted {restarts} times already (fault.max_restarts={fault.max_restarts}), "
                  f"so it stops here. {resume_advice(run_dir)}", file=sys.stderr, flush=True)
            return status
        hosts_before = plan.hosts
        wait, waited = fault.restart_wait_s * 2 ** restarts, 0.0
        try:
            if placed_anew is not None:  # the engine places the whole world again
                plan, env = placed_anew(cfg)
            else:
                cfg, plan, env, waited = _without_lost_hosts(cfg, run_dir, plan, env, relaunch, wait)
        except ConfigError as error:
            print(f"hvdtrain: {reason}; {error}. {resume_advice(run_dir)}", file=sys.stderr, flush=True)
            return status
        restarts += 1
        restart = record_restart(run_dir, restarts, reason, hosts_before, plan.hosts)
        print(f"hvdtrain: {reason}; restart {restarts} of {fault.max_restarts} in {wait - waited:g} s from step "
              f"{restart.step} ({restart.steps_lost} steps lost)", file=sys.stderr, flush=True)
        time.sleep(wait - waited)
        # Rank 0 prints the plan again as the job starts: say why, just before it.
        print(f"hvdtrain: restart {restarts} of {fault.max_restarts}: the job starts again from step {restart.step}",
              flush=True)


def _without_lost_hosts(cfg, run_dir, plan, env, relaunch, wait):
    """(cfg, plan, environment, seconds waited) for the restart: the same, or, where hosts do not
    answer even after `wait`, a smaller world of those that do (ConfigError where it cannot be)."""
    hosts_before = plan.hosts
    answering = mpirun.reachable_hosts(hosts_before, cfg.cluster.mpirun_args, env)
    if len(answering) == len(hosts_before):
        return cfg, plan, env, 0.0
    # A host may be on its way back (a pod or a node restarting): the wait before the restart is
    # its time to answer again and keep its place.
    time.sleep(wait)
    answering = mpirun.reachable_hosts(hosts_before, cfg.cluster.mpirun_args, env)
    if len(answering) == len(hosts_before):
        return cfg, plan, env, wait
    cfg, change = resized(cfg, hosts_before, answering)
    update_saved_config(Path(run_dir) / "config.yaml", {key: OmegaConf.select(cfg, key) for key in RESIZED_KEYS})
    plan, env = relaunch(cfg)
    print(f"hvdtrain: {change}", file=sys.stderr, flush=True)
    return cfg, plan, env, wait


def resume_advice(run_dir):
    """How to go on after the job stopped: from its newest checkpoint, or from its start where it
    wrote none (the same command: resume= trains a run without one from its start)."""
    newest = checkpoint.newest_metadata(Path(run_dir) / "checkpoints")
    if newest is None:
        return f"It wrote no checkpoint; start it again with: hvdtrain resume={run_dir}"
    return f"Continue from the last checkpoint (step {newest['global_step']}) with: hvdtrain resume={run_dir}"


def resized(cfg, hosts_before, hosts_after):
    """(cfg for `hosts_after` with the global batch of `hosts_before`, what changed in words), or
    ConfigError where that cannot be (too few hosts left, a global batch that does not divide
    without fault.allow_rescale)."""
    fault, train = cfg.fault, cfg.train
    lost = [h.host for h in hosts_before if h not in hosts_after]
    lost = f"host {lost[0]} does" if len(lost) == 1 else f"hosts {', '.join(lost)} do"
    needed = fault.min_hosts or len(hosts_before)
    if len(hosts_after) < needed:
        raise ConfigError(f"{lost} not answer, and {len(hosts_after)} of {len(hosts_before)} hosts are "
                          f"fewer than fault.min_hosts={fault.min_hosts} allows")
    ranks_before, ranks_after = (sum(h.slots for h in hosts) for hosts in (hosts_before, hosts_after))
    global_batch = ranks_before * train.batch_size * train.backward_passes_per_step
    cfg = copy.deepcopy(cfg)
    cfg.cluster.hosts, cfg.cluster.hostfile = [f"{h.host}:{h.slots}" for h in hosts_after], None
    cfg.cluster.num_hosts = len(hosts_after)
    by_passes = fault.keep_global_batch == "backward_passes"
    key = "train.backward_passes_per_step" if by_passes else "train.batch_size"
    others = ranks_after * (train.batch_size if by_passes else train.backward_passes_per_step)
    before = train.backward_passes_per_step if by_passes else train.batch_size
    rescaled = ranks_after * train.batch_size * train.backward_passes_per_step  # where nothing takes up the loss
    where = f"{lost} not answer; going on with {len(hosts_after)} of {len(hosts_before)} hosts"
    if global_batch % others == 0:
        OmegaConf.update(cfg, key, global_batch // others)
        return cfg, (f"{where}, {ranks_after} ranks, the global batch of {global_batch} kept by "
                     f"{key}={global_batch // others} (it was {before})")
    if not fault.allow_rescale:
        raise ConfigError(f"{where} would need {key}={global_batch}/{others} to keep the global batch of "
                          f"{global_batch}, not a whole number; set fault.allow_rescale=true to go on with "
                          f"{rescaled} at the linear rule's LR, "
                          f"or fault.keep_global_batch to the other way")
    return cfg, (f"{where}, {ranks_after} ranks; the global batch of {global_batch} cannot be kept "
                 f"(fault.allow_rescale=true): {rescaled} from here, at the LR the linear rule gives it, "
                 f"{cfg.optimizer.base_lr * rescaled / cfg.optimizer.base_batch_size:g} at the peak instead of "
                 f"{cfg.optimizer.base_lr * global_batch / cfg.optimizer.base_batch_size:g}")


def watch(command, env, run_dir, stall_shutdown_s):
    """Run `command` to its end, or stop it when rank 0 has made no training step for longer than
    `stall_shutdown_s` and its grace; outside training steps (starting Python, the frameworks and
    MPI, evaluating, writing the results, exiting) rank 0 gets at least OUTSIDE_STEPS_S."""
    shield = shielded_daemons(command, env)
    stop_signal = signal.SIGINT if shield else signal.SIGTERM
    latest, training = time.time(), False  # of the launch or of the last beat seen (the file goes when the run ends)
    limit = stall_shutdown_s + stall_grace_s(stall_shutdown_s) if stall_shutdown_s else None
    with mpirun.started(command, env={**env, **shield}, blocked_signals=[signal.SIGTERM] if shield else [],
                          stop_signal=stop_signal) as process:
        while process.poll() is None:
            time.sleep(POLL_S)
            beat = last_beat(run_dir)
            if beat and beat.time >= latest:
                latest, training = beat.time, beat.training
            elif not beat and training and not (Path(run_dir) / HEARTBEAT).exists():
                latest, training = time.time(), False  # the run has finished: the ranks are exiting
            quiet_s = time.time() - latest
            allowed = limit if training or limit is None else max(limit, OUTSIDE_STEPS_S)
            if limit is not None and quiet_s > allowed and process.poll() is None:
                mpirun.stop(process, signum=stop_signal)
                return Outcome(process.returncode, stalled_s=quiet_s)
    return Outcome(process.returncode)


def shielded_daemons(command, env):
    """Inside Slurm, a job's end (requeue, preemption, time limit) comes as SIGTERM to every process
    of the job, and mpirun and its daemons would kill the ranks at once: mpirun is started with
    SIGTERM blocked, and its daemons through signal_shield. The ranks, which unblock it
    (training/fault_tolerance.watch), take it themselves and have Slurm's KillWait to checkpoint. Returns the
    environment that does that for an mpirun `command` in a Slurm job (unless the user chose a
    launch agent), else {}."""
    if "SLURM_JOB_ID" not in env or os.path.basename(command[0]) != "mpirun" or LAUNCH_AGENT in env:
        return {}
    daemon = os.path.join(os.path.dirname(command[0]), "prted")
    return {LAUNCH_AGENT: f"{sys.executable} -m hvdtrain.launch.signal_shield TERM,USR1,USR2 {daemon}"}


def failure(outcome, run_dir, cfg):
    """Why the job failed, in words, or None where it finished the run."""
    status = outcome.returncode
    if outcome.stalled_s:
        return (f"the job made no training step for {outcome.stalled_s:.0f} s (fault.stall_shutdown_s="
                f"{cfg.fault.stall_shutdown_s:g}) and was stopped")
    if status == 0:
        done = epochs_completed(run_dir)
        if done >= cfg.train.epochs:
            return None
        # mpirun has been seen to exit 0 after losing a remote daemon
        return f"mpirun exited 0 but the run finished {done} of {cfg.train.epochs} epochs"
    if status > 128 and status - 128 in signal.valid_signals():
        return f"a rank was killed by {signal.Signals(status - 128).name} (mpirun exit status {status})"
    if status == EXIT_COMMUNICATION:
        return f"a rank's collectives failed: a peer went away or stalled (exit status {status})"
    return f"the workers failed (mpirun exit status {status})"


def epochs_completed(run_dir):
    try:
        return json.loads((Path(run_dir) / "results.json").read_text())["epochs_completed"]
    except (OSError, ValueError, KeyError):
        return 0


def record_restart(run_dir, attempt, reason, hosts_before, hosts_after):
    """Append the restart to the run's metrics.jsonl: it resumes from the newest valid checkpoint,
    and the steps rank 0 made after it are lost."""
    newest = checkpoint.newest_metadata(Path(run_dir) / "checkpoints")
    step = newest["global_step"] if newest else 0
    beat = last_beat(run_dir)
    reached = beat.global_step if beat else step
    restart = Restart("restart", time.time(), attempt, reason, step, max(0, reached - step),
                      [f"{h.host}:{h.slots}" for h in hosts_before], [f"{h.host}:{h.slots}" for h in hosts_after])
    with open(Path(run_dir) / "metrics.jsonl", "a") as log:
        log.write(json.dumps(asdict(restart)) + "\n")
    return restart
