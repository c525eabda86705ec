"""A run's account of itself as it trains, the same for every framework's loop.

Every rank times its steps and adds up their losses; every `train.log_every_steps` steps (and
at the end of each epoch) the loss is averaged over the ranks and recorded. A loss may be a
float or a framework's 0-d tensor, still on its device: the losses are added as they come and
read (float()) only when recorded, as reading a GPU's tensor waits for the GPU to finish the
steps queued before it, which every step would otherwise do. Rank 0 alone prints
the plan at the start, keeps the run's log (metrics.jsonl, TensorBoard, progress bar: run_log.py),
rewrites results.json at the end of every epoch (so that a run that stops early says how far it
got) and writes report.md at the end (report.py); the other ranks take part in the averaging only.

The run's clocks span its sessions (a resumed run goes on from its checkpoint's): wall time from
each session's process start, and the part of it spent inside training steps.
"""

import time
from typing import NamedTuple

import numpy as np

from hvdtrain import core
from hvdtrain.runner.plan import summary
from hvdtrain.runner.supervisor import Heartbeat
from hvdtrain.reporting.report import final_summary, write_report, write_results
from hvdtrain.reporting.run_log import RunLog
from hvdtrain.training import preemption


class Agreed(NamedTuple):
    """What the ranks agreed on after a step (Progress.step_done)."""
    checkpoint: bool  # due by time
    stop: bool  # preempted: checkpoint and stop
    requeue: bool  # ... and requeue the Slurm job: some rank's notice was a requeue signal


class Progress:
    def __init__(self, cfg, plan, run_dir, start, session_start):
        """`start`: where training starts (checkpoint.fresh_start() or a checkpoint's state);
        `session_start`: when this process began, so that setup counts as run time."""
        self.cfg, self.plan, self.run_dir = cfg, plan, run_dir
        self.elapsed_before, self.session_start = start["elapsed_s"], session_start
        self.train_seconds = start["train_s"]  # inside training steps, over all sessions
        self.log = self.heartbeat = None
        if core.rank() == 0:
            print(summary(plan, cfg, run_dir), flush=True)
            if start["global_step"]:
                print(f"hvdtrain: resuming at epoch {start['epoch']}, step {start['step']} ({start['path']})",
                      flush=True)
            self.log = RunLog(run_dir, plan.steps_per_epoch * plan.epochs, start["global_step"], core.size())
            self.heartbeat = Heartbeat(run_dir)
            self.heartbeat.beat(start["global_step"])
        self.last_checkpoint = time.time()
        self.window_loss, self.window_seconds, self.window_steps = 0.0, 0.0, 0  # since the last record
        self.train_loss = None  # the last recorded one

    def elapsed_s(self):
        """The run's wall time so far, over all its sessions."""
        return self.elapsed_before + time.time() - self.session_start

    def train_s(self):
        """The part of elapsed_s() spent inside training steps."""
        return self.train_seconds

    def step_done(self, epoch, step, global_step, lr, loss, seconds):
        """Step `step` of `epoch` (the run's `global_step`-th), trained at `lr`, took `seconds`
        and had this rank's mean loss `loss` (a float, or a 0-d tensor read only if recorded).
        Returns what the ranks agreed on in the recorded loss's allreduce, the same on every
        rank: whether a checkpoint is due by time (train.checkpoint_every_s: rank 0's clock
        decides), whether to stop for a preemption (any rank's notice, preemption.py) and whether
        to requeue the job then (any rank's notice was a requeue signal: with scancel --signal,
        Slurm signals the ranks of a job step and not the others)."""
        self.window_loss, self.window_steps = self.window_loss + loss, self.window_steps + 1
        if self.log:
            self.log.advance()
            self.heartbeat.beat(global_step)
        steps = self.plan.steps_per_epoch
        recording = global_step % self.cfg.train.log_every_steps == 0 or step == steps - 1
        if recording:
            began = time.perf_counter()
            mean = float(self.window_loss) / self.window_steps
            seconds += time.perf_counter() - began  # the wait for the device's queued steps is theirs
        self.train_seconds += seconds
        self.window_seconds += seconds
        if not recording:
            return Agreed(checkpoint=False, stop=False, requeue=False)
        every_s = self.cfg.train.checkpoint_every_s
        due = bool(self.log and every_s and time.time() - self.last_checkpoint >= every_s)
        notice = preemption.notice(self.run_dir if self.log else None)
        requeue = bool(notice and notice.signal_name in preemption.requeue_signal_names(self.cfg.train.preempt_signal))
        averaged = core.allreduce_async(np.array([mean, due, notice is not None, requeue]), name="train.loss",
                                        op=core.ReduceOp.AVERAGE).wait()
        self.train_loss = float(averaged[0])
        if self.log:
            self.log.record(event="train", step=global_step, epoch=epoch + (step + 1) / steps, lr=lr,
                            loss=self.train_loss,
                            samples_per_s=self.window_steps * self.plan.global_batch_size / self.window_seconds)
        self.window_loss, self.window_seconds, self.window_steps = 0.0, 0.0, 0
        return Agreed(*(bool(flag > 0) for flag in averaged[1:]))

    def checkpointed(self):
        self.last_checkpoint = time.time()

    def preempted(self, global_step, notice):
        """Rank 0: the run stops early after `global_step`, checkpointed, on `notice` (this
        rank's, or None where another rank had it): recorded in metrics.jsonl and said."""
        if not self.log:
            return
        now = time.time()
        event = {"event": "preempted", "step": global_step, "time": now,
                 "signal": notice.signal_name if notice else "another rank's"}
        if notice:
            event["notice_to_checkpoint_s"] = round(now - notice.received_at, 3)
        self.log.record(**event)
        self.log.close()
        self.heartbeat.close()
        print(f"hvdtrain: preempted ({event['signal']}): stopped after step {global_step} with a checkpoint"
              + (f", {event['notice_to_checkpoint_s']} s after the notice" if notice else ""), flush=True)

    def evaluated(self, epoch, global_step, lr, metrics):
        """The validation `metrics` after `epoch` epochs; its last step was recorded just now, so
        the loss recorded beside them is that step's window's."""
        if self.log:
            self.heartbeat.beat(global_step)
            self.log.record(event="eval", step=global_step, epoch=epoch, lr=lr, loss=self.train_loss, **metrics)

    def epoch_done(self, epochs_completed, global_step, metrics):
        """Rank 0: results.json as of now, `epochs_completed` epochs (`global_step` steps) in."""
        if self.log:
            self._results(epochs_completed, global_step, metrics)

    def finish(self, epochs_completed, global_step, metrics):
        """Rank 0: results.json, report.md and the closing summary."""
        if not self.log:
            return
        self.heartbeat.beat(global_step)  # the report's plots take a while
        self.log.close()
        results = self._results(epochs_completed, global_step, metrics)
        write_report(self.run_dir, self.cfg, self.plan, results)
        self.heartbeat.close()
        print(final_summary(results, self.run_dir), flush=True)

    def _results(self, epochs_completed, global_step, metrics):
        return write_results(self.run_dir, self.cfg, self.plan, epochs_completed, metrics,
                             samples_trained=global_step * self.plan.global_batch_size,
                             wall_time_s=self.elapsed_s(), train_time_s=self.train_s())
