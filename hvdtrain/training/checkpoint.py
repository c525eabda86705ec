"""Checkpoint files: written atomically, the last K kept, the newest valid one found again, and
the metadata every checkpoint carries beside the model.

A checkpoint is a zip archive (stored, not compressed) of two members: `metadata.json`, plain
JSON that any process can read without a framework (the `hvdtrain` command reads it to tell how
far a run got), and `state`, the framework's bytes (train_torch.py's from torch.save, read back
with torch.load(weights_only=True) onto the CPU, so that a GPU's checkpoint resumes anywhere;
train_tensorflow.py's a NumPy .npz archive read with allow_pickle=False). The zip's CRC-32 of each
member tells a damaged file from a good one before any framework looks at it.
"""

import copy
import io
import json
import sys
import zipfile
from pathlib import Path

from hvdtrain.run.config import config_hash
from hvdtrain.run.run_dir import write_atomically

PATTERN = "step-*.ckpt"
METADATA, STATE = "metadata.json", "state"


def path_for(directory, global_step):
    return Path(directory) / f"step-{global_step:09d}.ckpt"


def save(directory, metadata, state, keep):
    """Write the checkpoint of `metadata["global_step"]` (its framework `state` bytes beside the
    metadata) and delete all but the newest `keep`, and any temporary file an interrupted write
    left behind."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    for stale in Path(directory).glob(".*.tmp"):
        stale.unlink()
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as members:
        members.writestr(METADATA, json.dumps(metadata))
        members.writestr(STATE, state)
    write_atomically(path_for(directory, metadata["global_step"]), archive.getvalue())
    for old in sorted(Path(directory).glob(PATTERN))[:-keep]:
        old.unlink()


def read(path, decode):
    """A checkpoint's metadata with the framework's parts, decode(state bytes), merged in."""
    with zipfile.ZipFile(path) as members:  # reading a member checks its CRC-32
        metadata = json.loads(members.read(METADATA))
        return {**metadata, **decode(members.read(STATE))}


def load_newest_valid(directory, decode, quiet=False):
    """(path, state) of the newest checkpoint that reads and decodes (see `read`), or (None, None)
    if there is none. One that does not (truncated, corrupt) is skipped, said in one line on
    stderr unless `quiet`."""
    for path in sorted(Path(directory).glob(PATTERN), reverse=True):
        try:
            return path, read(path, decode)
        except Exception as error:  # any failure to read means: not a usable checkpoint
            if not quiet:
                print(f"hvdtrain: skipping checkpoint {path}: it cannot be read ({type(error).__name__}: {error})",
                      file=sys.stderr, flush=True)
    return None, None


def fresh_start():
    """Where a run without a checkpoint starts, in the terms of a checkpoint's metadata."""
    return {"epoch": 0, "step": 0, "global_step": 0, "metrics": {}, "elapsed_s": 0.0, "train_s": 0.0, "path": None}


def newest_metadata(directory):
    """The metadata of the newest valid checkpoint, read without any framework (the framework's
    state is checked by its CRC only), or None. Quiet about damaged ones: the training loop that
    skips them says so."""
    return load_newest_valid(directory, decode=lambda state: {}, quiet=True)[1]


def metadata(cfg, epoch, step, global_step, world_size, metrics, elapsed_s, train_s):
    """The metadata of a checkpoint taken before step `step` of `epoch`: everything a resumed run
    needs besides the framework's state to go on exactly as this one would (see sharding.py for
    why no RNG state is needed), what identifies the run, and the time it has taken so far
    (`elapsed_s` of wall time, `train_s` of it inside training steps)."""
    global_batch = world_size * cfg.train.batch_size * cfg.train.backward_passes_per_step
    return {
        "epoch": epoch,
        "step": step,
        "global_step": global_step,
        "samples_done_in_epoch": step * global_batch,  # of every rank: where a smaller world goes on
        "seed": cfg.train.seed,
        "world_size": world_size,
        "global_batch_size": global_batch,
        "config_hash": compatibility_hash(cfg),
        "metrics": metrics,
        "elapsed_s": elapsed_s,
        "train_s": train_s,
    }


def compatibility_hash(cfg):
    """What a checkpoint must agree on with the run that resumes from it: the config without
    train.epochs, which says only where training stops (resume=DIR train.epochs=N extends a run;
    the LR schedule takes it as an argument), without train.device, which says only where it
    trains (resume=DIR train.device=cpu goes on from a GPU's checkpoint), and without how the
    global batch is divided between ranks, which changes when a restart leaves out lost hosts
    (`_mismatch` compares the global batch). config_hash leaves out the hosts and the
    supervision (cluster, fault) anyway."""
    unbounded = copy.deepcopy(cfg)
    unbounded.train.epochs = 0
    unbounded.train.device = "any"
    unbounded.train.batch_size = unbounded.train.backward_passes_per_step = 0
    return config_hash(unbounded)


def step_in_epoch(state, global_batch):
    """The step of its epoch a run with `global_batch` resumes from `state` at: the checkpoint's,
    or, where the global batch has changed (fault.allow_rescale), the first step whose samples
    the checkpoint's run had not trained on."""
    if state.get("global_batch_size", global_batch) == global_batch:
        return state["step"]
    return -(-state["samples_done_in_epoch"] // global_batch)


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
    if state["config_hash"] != compatibility_hash(cfg):
        return f"checkpoint {path} was written by a run with another config; it cannot be resumed with this one"
    if state["epoch"] > cfg.train.epochs:
        return (f"checkpoint {path} has {state['epoch']} epochs done, more than train.epochs={cfg.train.epochs} "
                f"of this run")
    global_batch = world_size * cfg.train.batch_size * cfg.train.backward_passes_per_step
    if "global_batch_size" not in state and state["world_size"] != world_size:  # written before it was recorded
        return (f"checkpoint {path} was written by {state['world_size']} ranks and this run has {world_size}: "
                f"resume on the same number of ranks")
    if state.get("global_batch_size", global_batch) != global_batch and not cfg.fault.allow_rescale:
        return (f"checkpoint {path} was trained with a global batch of {state['global_batch_size']} and this run's is "
                f"{global_batch} ({world_size} ranks x train.batch_size={cfg.train.batch_size} x "
                f"train.backward_passes_per_step={cfg.train.backward_passes_per_step}); fault.allow_rescale=true "
                f"goes on at the linear rule's LR for it")
    return None
