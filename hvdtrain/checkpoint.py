"""Checkpoint files: written atomically, the last K kept, the newest valid one found again.

The bytes come from the framework's training loop (train_torch.py serializes with torch.save and
reads back with torch.load(weights_only=True)); this module only deals with files, so that
another framework's loop can use it as it is.
"""

import os
import warnings
from pathlib import Path

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
