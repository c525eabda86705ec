"""A run's directory and the files in it that the launcher and rank 0 share.

- config.yaml: the resolved config, written once by the `hvdtrain` command (claim_run_dir) and
  read by rank 0, which broadcasts it (no rank composes its own, so no other host needs the
  directory); a resume may change only RESUMABLE_KEYS in it, a restart on fewer hosts the layout.
- .heartbeat: rank 0's last training step and whether it is training or busy between stretches of
  steps (starting, evaluating, finishing), rewritten in place after every step, which the
  supervisor watches for a job that makes no progress.
- checkpoints/, metrics.jsonl, results.json, report.md: written by rank 0 (hvdtrain/training/
  checkpoint.py, hvdtrain/reporting/), every file that a reader must see whole atomically.
"""

import os
from pathlib import Path
from typing import NamedTuple

from omegaconf import OmegaConf

from hvdtrain.run.config import RESUMABLE_KEYS, ConfigError, typed

HEARTBEAT = ".heartbeat"


def write_atomically(path, data):
    """Write `data` to `path` so that a reader sees the old file or the whole new one, never a
    part: a temporary file is written and synced, then renamed over `path`. The temporary file is
    this process's own, so that processes writing the same file at once (two runs making one
    data cache) do not write into each other's."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # makes the rename itself durable
    finally:
        os.close(directory)


def load_run_config(path):
    """A run directory's resolved config.yaml, typed by the schema."""
    return typed(OmegaConf.load(path))


def claim_run_dir(cfg, run_dir):
    """Make `run_dir` this run's by writing the resolved config.yaml into it (which rank 0
    then loads); a new run must not take another's directory. A resumed run has one already:
    the keys the command line may change (RESUMABLE_KEYS) are written into it, so that its
    workers, and any later resume, train with them."""
    if cfg.resume:
        update_saved_config(run_dir / "config.yaml", {key: OmegaConf.select(cfg, key) for key in RESUMABLE_KEYS})
        return
    if (run_dir / "config.yaml").exists():
        raise ConfigError(f"the run directory {run_dir} already holds a run: continue it with resume={run_dir}, "
                          f"or give another hydra.run.dir")
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)


def update_saved_config(path, values):
    """Set `values` (dotted keys) in the config.yaml at `path`, replaced atomically, and only
    where something changes."""
    saved = OmegaConf.load(path)
    if all(OmegaConf.select(saved, key) == value for key, value in values.items()):
        return
    for key, value in values.items():
        OmegaConf.update(saved, key, value)
    write_atomically(path, OmegaConf.to_yaml(saved).encode())


class Heartbeat:
    """Rank 0's record of its last training step: one small write per step, in place; gone
    when the run has finished. `training` says whether the next step is due at once, or rank 0 is
    busy outside the steps (starting, evaluating, writing the results), which no stall limit on
    steps measures."""

    def __init__(self, run_dir):
        self.path = Path(run_dir) / HEARTBEAT
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)

    def beat(self, global_step, training=True):
        os.pwrite(self.fd, b"%20d %d\n" % (global_step, training), 0)

    def close(self):
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


class Beat(NamedTuple):
    time: float
    global_step: int
    training: bool


def last_beat(run_dir):
    """The last Beat, or None where there has been none (or the run has finished)."""
    path = Path(run_dir) / HEARTBEAT
    try:
        step, training = path.read_text().split()
        return Beat(path.stat().st_mtime, int(step), training == "1")
    except (OSError, ValueError):
        return None


def clear_heartbeat(run_dir):
    """Before a launch: the last job's beats say nothing of the next one's."""
    (Path(run_dir) / HEARTBEAT).unlink(missing_ok=True)
