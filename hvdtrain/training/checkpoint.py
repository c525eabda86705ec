"""Checkpoint files: written atomically, the last K kept, the newest valid one found again, and
the metadata every checkpoint carries beside the model.

The bytes come from the framework's training loop (train_torch.py serializes with torch.save and
reads back with torch.load(weights_only=True), train_tensorflow.py writes NumPy .npz archives);
this module deals with files and metadata, so that every framework's loop uses it as it is.
"""

import os
import warnings
from pathlib import Path

from hvdtrain.runner.config import config_hash

PATTERN = "step-*.ckpt"


def path_for(directory, global_step):
    return Path(directory) / f"step-{global_step:09d}.ckpt"


def write_atomically(path, data):
    """Write `data` to `path` so that a reader sees the old file or the whole new one, never a
    part: a temporary file is written and synced, then renamed over `path`."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # makes the rename itself durable
    finally:
        os.close(directory)


def save(directory, global_step, data, keep):
    """Write the checkpoint of `global_step` and delete all but the newest `keep`, and any
    temporary file an interrupted write left behind."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    for stale in Path(directory).glob(".*.tmp"):
        stale.unlink()
    write_atomically(path_for(directory, global_step), data)
    for old in sorted(Path(directory).glob(PATTERN))[:-keep]:
        old.unlink()


def load_newest_valid(directory, decode):
    """(path, decode(bytes)) of the newest checkpoint that decodes, or (None, None) if there is
    none. A checkpoint that does not decode (truncated, corrupt) is skipped with a warning."""
    for path in sorted(Path(directory).glob(PATTERN), reverse=True):
        try:
            return path, decode(path.read_bytes())
        except Exception as error:  # any failure to read means: not a usable checkpoint
            warnings.warn(f"skipping checkpoint {path}: it cannot be read ({type(error).__name__}: {error})",
                          stacklevel=2)
    return None, None


def fresh_start():
    """Where a run without a checkpoint starts, in the terms of a checkpoint's metadata."""
    return {"epoch": 0, "step": 0, "global_step": 0, "metrics": {}, "elapsed_s": 0.0, "path": None}


def metadata(cfg, epoch, step, global_step, world_size, metrics, elapsed_s):
    """The metadata of a checkpoint taken before step `step` of `epoch`: everything a resumed run
    needs besides the framework's state to go on exactly as this one would (see sharding.py for
    why no RNG state is needed), and what identifies the run."""
    return {
        "epoch": epoch,
        "step": step,
        "global_step": global_step,
        "samples_done_in_epoch": step * cfg.train.batch_size * cfg.train.backward_passes_per_step,
        "seed": cfg.train.seed,
        "world_size": world_size,
        "config_hash": config_hash(cfg),
        "metrics": metrics,
        "elapsed_s": elapsed_s,
    }


def resume_state(directory, cfg, decode):
    """On every rank of a job: the state of the newest valid checkpoint in `directory`, which rank
    0 reads and broadcasts, or None when there is none. A checkpoint of another config or
    another number of ranks stops every rank with the reason."""
    from hvdtrain import core

    state = None
    if core.rank() == 0:
        path, state = load_newest_valid(directory, decode)
        if state is not None:
            state["path"] = str(path)
            problem = _mismatch(state, cfg, path, core.size())
            state = RuntimeError(problem) if problem else state
    state = core.broadcast_object(state, root_rank=0, name="checkpoint")
    if isinstance(state, RuntimeError):
        raise state
    return state


def _mismatch(state, cfg, path, world_size):
    if state["config_hash"] != config_hash(cfg):
        return f"checkpoint {path} was written by a run with another config; it cannot be resumed with this one"
    if state["world_size"] != world_size:
        return (f"checkpoint {path} was written by {state['world_size']} ranks and this run has {world_size}: "
                f"resume on the same number of ranks")
    return None
