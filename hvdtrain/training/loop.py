"""The story both training loops tell, told once: start from rank 0's weights or from the newest
valid checkpoint that rank 0 reads and broadcasts; for each epoch from there, each rank trains on
its shard (sharding.py) step by step at the LR of the schedule (hvdtrain/run/config/schedule.py);
at every logged step the ranks agree, in one allreduce, on the mean loss and on what the run's
safeguards ask (fault_tolerance.py): a checkpoint due by time, a stop on a scheduler's notice;
it checkpoints every `train.checkpoint_every_steps` steps, when due and at the epoch's end,
evaluates every `train.eval_every_epochs` epochs and at the last, and stops early, checkpointed,
when its scheduler asks; progress and results along the way (hvdtrain/reporting/progress.py).

train_torch.py and train_tensorflow.py call `run` with their framework's part of each of these
as plain functions; this module imports no framework (the ranks' identity comes from the core
that both adapters initialize).
"""

import time

import numpy as np

from hvdtrain import core
from hvdtrain.reporting.progress import Progress
from hvdtrain.run.config.schedule import learning_rate
from hvdtrain.training import checkpoint, fault_tolerance, sharding
from hvdtrain.training.fault_tolerance import CARRY_ON, Safeguards


def run(cfg, plan, run_dir, session_start, train_size, *, decode, restore, broadcast_initial, epoch_batches,
        train_step, evaluate, checkpoint_state, input_counts=None):
    """Train from where the run stands to `train.epochs`. The framework's parts, called on every rank:
    - decode(bytes) -> dict: a checkpoint's framework state as checkpoint_state() wrote it;
    - restore(state): take a checkpoint's state (the decoded parts and the metadata);
    - broadcast_initial(): take rank 0's initial weights, when there is no checkpoint;
    - epoch_batches(epoch, indices) -> iterator over the batches of these samples in order;
    - train_step(batches, lr, global_step) -> this rank's mean loss of one optimizer step, a float or
      a 0-d tensor left on its device (progress.py reads it only when it records);
    - evaluate() -> the validation metrics, or evaluate=None when there is no validation set;
    - input_counts() -> what the input pipeline met in the epoch just trained, added up over the
      ranks (a collective: {"decoded_on_cpu": n, "bad_files_skipped": n}), or None where it has
      nothing to count;
    - checkpoint_state() -> the bytes of the framework's state on rank 0 (None on the others),
      after making every rank's copy of the model the same (BatchNorm statistics averaged).
    """
    start = checkpoint.resume_state(run_dir / "checkpoints", cfg, decode)
    if start is None:
        broadcast_initial()
        start = checkpoint.fresh_start()
    else:
        restore(start)

    progress = Progress(cfg, plan, run_dir, start, session_start)
    safeguards = Safeguards(cfg.train, run_dir, reads_run_dir=core.rank() == 0)
    steps, epochs, every = plan.steps_per_epoch, cfg.train.epochs, cfg.train.checkpoint_every_steps
    samples_per_step = cfg.train.batch_size * cfg.train.backward_passes_per_step
    global_step, metrics, lr = start["global_step"], start["metrics"], plan.base_lr

    def save(epoch, step, global_step, metrics):
        """Checkpoint the state before step `step` of `epoch`."""
        state = checkpoint_state()
        if core.rank() == 0:
            metadata = checkpoint.metadata(cfg, epoch, step, global_step, core.size(), metrics,
                                           progress.elapsed_s(), progress.train_s())
            checkpoint.save(run_dir / "checkpoints", metadata, state, cfg.train.keep_checkpoints)
        safeguards.checkpointed()

    def stop_preempted(epoch, step, global_step, metrics, requeue):
        """Checkpoint before step `step` of `epoch` and stop every rank. Rank 0 requeues its Slurm
        job first where a notice asked for that, while the others wait for it: none may end the
        job before its checkpoint and requeue are done."""
        save(epoch, step, global_step, metrics)
        notice = fault_tolerance.notice(run_dir if core.rank() == 0 else None)
        if core.rank() == 0:
            progress.preempted(global_step, notice)
            if requeue:
                fault_tolerance.requeue_job()
        core.barrier()
        raise fault_tolerance.Preempted(f"preempted after step {global_step}")

    for epoch in range(start["epoch"], epochs):
        first = checkpoint.step_in_epoch(start, plan.global_batch_size) if epoch == start["epoch"] else 0
        if first:  # the LR of the step taken last, which an evaluation before the next one records
            lr = learning_rate(epoch + (first - 1) / steps, cfg.schedule, plan.base_lr, plan.peak_lr, epochs)
        shard = sharding.train_shard(train_size, cfg.train.seed, epoch, core.rank(), core.size())
        batches = epoch_batches(epoch, shard[first * samples_per_step:steps * samples_per_step])
        for step in range(first, steps):
            began = time.perf_counter()
            lr = learning_rate(epoch + step / steps, cfg.schedule, plan.base_lr, plan.peak_lr, epochs)
            loss = train_step(batches, lr, global_step)
            global_step += 1
            decision = CARRY_ON
            mine = progress.step_done(step, global_step, loss, time.perf_counter() - began)
            if mine is not None:
                averaged = core.allreduce_async(np.array([mine, *safeguards.votes()]), name="train.loss",
                                                op=core.ReduceOp.AVERAGE).wait()
                progress.record(epoch, step, global_step, lr, float(averaged[0]))
                decision = safeguards.decide(averaged[1:])
            if decision.stop:
                stop_preempted(epoch, step + 1, global_step, metrics, decision.requeue)
            if (decision.checkpoint or (every and global_step % every == 0)) and step < steps - 1:
                save(epoch, step + 1, global_step, metrics)

        if evaluate and ((epoch + 1) % cfg.train.eval_every_epochs == 0 or epoch + 1 == epochs):
            progress.evaluating(global_step)
            metrics = evaluate()
            progress.evaluated(epoch + 1, global_step, lr, metrics)
        save(epoch + 1, 0, global_step, metrics)
        progress.epoch_done(epoch + 1, global_step, metrics, input_counts() if input_counts else None)
    progress.finish(epochs, global_step, metrics)
