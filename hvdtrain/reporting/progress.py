"""A run's account of itself as it trains, the same for every framework's loop.

Every rank times its steps and adds up their losses; every `train.log_every_steps` steps (and
at the end of each epoch) the training loop averages the loss over the ranks and this records
it. A loss may be a
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

from hvdtrain import core
from hvdtrain.reporting.report import final_summary, write_report, write_results
from hvdtrain.reporting.run_log import RunLog
from hvdtrain.run.plan import summary
from hvdtrain.run.run_dir import Heartbeat


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
            self.heartbeat.beat(start["global_step"], training=False)  # until its first step
        self.window_loss, self.window_seconds, self.window_steps = 0.0, 0.0, 0  # since the last record
        # The last recorded loss, which an evaluation records beside it: after a stop at an epoch's
        # last step, the resumed run evaluates before it trains
        self.train_loss = self.log.last_train_loss() if self.log else None
        self.inputs = None  # the input pipeline's counts of the last epoch

    def elapsed_s(self):
        """The run's wall time so far, over all its sessions."""
        return self.elapsed_before + time.time() - self.session_start

    def train_s(self):
        """The part of elapsed_s() spent inside training steps."""
        return self.train_seconds

    def step_done(self, step, global_step, loss, seconds):
        """Step `step` of its epoch (the run's `global_step`-th) took `seconds` and had this rank's
        mean loss `loss` (a float, or a 0-d tensor read only if recorded). Returns this rank's mean
        loss over the steps since the last record where this step is recorded (every
        train.log_every_steps steps and at the end of each epoch: the caller averages it over the
        ranks and hands it to `record`), else None."""
        self.window_loss, self.window_steps = self.window_loss + loss, self.window_steps + 1
        if self.log:
            self.log.advance()
            self.heartbeat.beat(global_step)
        recording = global_step % self.cfg.train.log_every_steps == 0 or step == self.plan.steps_per_epoch - 1
        mean = None
        if recording:
            began = time.perf_counter()
            mean = float(self.window_loss) / self.window_steps
            seconds += time.perf_counter() - began  # the wait for the device's queued steps is theirs
        self.train_seconds += seconds
        self.window_seconds += seconds
        return mean

    def record(self, epoch, step, global_step, lr, loss):
        """Record the loss averaged over the ranks for the steps up to `step` of `epoch`, trained at
        `lr`, with their throughput."""
        self.train_loss = loss
        if self.log:
            steps = self.plan.steps_per_epoch
            self.log.record(event="train", step=global_step, epoch=epoch + (step + 1) / steps, lr=lr,
                            loss=self.train_loss,
                            samples_per_s=self.window_steps * self.plan.global_batch_size / self.window_seconds)
        self.window_loss, self.window_seconds, self.window_steps = 0.0, 0.0, 0

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

    def evaluating(self, global_step):
        if self.log:
            self.heartbeat.beat(global_step, training=False)

    def evaluated(self, epoch, global_step, lr, metrics):
        """The validation `metrics` after `epoch` epochs; its last step was recorded just now, so
        the loss recorded beside them is that step's window's."""
        if self.log:
            self.heartbeat.beat(global_step)
            self.log.record(event="eval", step=global_step, epoch=epoch, lr=lr, loss=self.train_loss, **metrics)

    def epoch_done(self, epochs_completed, global_step, metrics, inputs=None):
        """Rank 0: results.json as of now, `epochs_completed` epochs (`global_step` steps) in, with
        what the input pipeline met in the last epoch (`inputs`, where it counts anything)."""
        self.inputs = inputs
        if self.log:
            self._results(epochs_completed, global_step, metrics)

    def finish(self, epochs_completed, global_step, metrics):
        """Rank 0: results.json, report.md and the closing summary."""
        if not self.log:
            return
        self.heartbeat.beat(global_step, training=False)  # the report's plots take a while
        self.log.close()
        results = self._results(epochs_completed, global_step, metrics)
        write_report(self.run_dir, self.cfg, self.plan, results)
        self.heartbeat.close()
        print(final_summary(results, self.run_dir), flush=True)

    def _results(self, epochs_completed, global_step, metrics):
        return write_results(self.run_dir, self.cfg, self.plan, epochs_completed, metrics,
                             samples_trained=global_step * self.plan.global_batch_size,
                             wall_time_s=self.elapsed_s(), train_time_s=self.train_s(), inputs=self.inputs)
