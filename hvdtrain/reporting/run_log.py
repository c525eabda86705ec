"""Rank 0's record of a run as it goes: metrics.jsonl, TensorBoard events and the progress bar.

Framework-neutral: every training loop hands it plain numbers. On resume, the records written
after the checkpoint by the interrupted run are dropped (from metrics.jsonl, and from
TensorBoard by a restart marker), so the resumed run's history has no duplicates.
"""

import json
import os
import socket
import sys
import time
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter
from tqdm import tqdm

from hvdtrain.run.job import progress_bar_wanted


class RunLog:
    def __init__(self, run_dir, total_steps, start_step, world_size):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.world_size = world_size
        self.events = TensorBoardEvents(Path(run_dir) / "tensorboard")
        if start_step > 0:
            keep_history_until(self.path, start_step)
            # TensorBoard drops the interrupted run's events from this step on.
            self.events.add(Event(step=start_step + 1, session_log=SessionLog(status=SessionLog.START)))
        # A bar redrawn with carriage returns garbles a log file (a batch job's, a CI run's):
        # where no terminal shows it, every record gets a line of its own instead.
        self.interactive = progress_bar_wanted(os.environ)
        self.bar = tqdm(total=total_steps, initial=start_step, unit="step", file=sys.stderr,
                        dynamic_ncols=True, mininterval=1.0, disable=not self.interactive)

    def last_train_loss(self):
        """The loss of the last training record kept, or None."""
        losses = [record["loss"] for record in read_history(self.path) if record["event"] == "train"]
        return losses[-1] if losses else None

    def advance(self):
        self.bar.update(1)

    def record(self, **values):
        """Append one event (step, epoch, lr, loss, and whatever else was measured)."""
        with open(self.path, "a") as file:
            file.write(json.dumps(values) + "\n")
        scalars = [Summary.Value(tag=key, simple_value=float(value)) for key, value in values.items()
                   if key not in ("step", "epoch", "event") and isinstance(value, (int, float))]
        self.events.add(Event(step=values["step"], summary=Summary(value=scalars)))
        if "samples_per_s" in values:
            throughput = (f"{values['samples_per_s']:.0f} samples/s "
                          f"({values['samples_per_s'] / self.world_size:.0f} per worker)")
            if self.interactive:
                self.bar.set_postfix_str(f"loss {values['loss']:.4f}, lr {values['lr']:.4g}, {throughput}",
                                         refresh=False)
            else:
                self.bar.write(f"step {values['step']}  epoch {values['epoch']:.4g}  lr {values['lr']:.4g}  "
                               f"loss {values['loss']:.4f}  {throughput}", file=sys.stderr)
        else:
            self.bar.write("  ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                                     for key, value in values.items() if key != "event"), file=sys.stderr)

    def close(self):
        self.bar.close()
        self.events.close()


class TensorBoardEvents:
    """An event file TensorBoard reads. TensorBoard's own EventFileWriter opens files through
    TensorFlow when it is installed, which costs each run seconds; its record format is plain."""

    def __init__(self, directory):
        directory.mkdir(parents=True, exist_ok=True)
        self.file = open(directory / f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}", "wb")
        self.records = RecordWriter(self.file)
        self.add(Event(file_version="brain.Event:2"))

    def add(self, event):
        event.wall_time = time.time()
        self.records.write(event.SerializeToString())
        self.records.flush()

    def close(self):
        self.file.close()


def keep_history_until(path, last_step):
    """Drop the records after `last_step` from a metrics.jsonl (the steps a resumed run redoes)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


def read_history(path):
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
