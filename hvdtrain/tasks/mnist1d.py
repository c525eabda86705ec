"""MNIST-1D (Greydanus 2020, "Scaling down deep learning", arXiv:2011.14439): 40-value signals of
the 10 digits, made by the `mnist1d` package from its templates with its own transforms, its own
arguments and a seed. Its `make_dataset` builds the data without a download; its default
arguments and seed make, for 5,000 samples, the data set of the paper.

The data is made once per (package version, arguments, templates) and kept in a cache file; the
ranks share rank 0's copy: rank 0 alone makes or reads the file (no host needs another's file
system) and broadcasts the arrays, so that every rank trains on the same data. Making 100,000
samples takes about a minute, longer than the core's stall inspector lets ranks wait in one
collective before it warns (HOROVOD_STALL_CHECK_TIME_SECONDS, 60 s) or stops the job
(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS): meanwhile rank 0 tells the others every few seconds that
the data is not ready yet.
"""

import concurrent.futures
import hashlib
import importlib.metadata
import io
import json
import random
import zipfile
from pathlib import Path

import numpy as np

from hvdtrain.run.run_dir import write_atomically

# Measured on one core of a 2-core machine: 20,000 samples in 11 to 14 s; said before a long wait.
SAMPLES_MADE_PER_SECOND = 1500
WAIT_REPORT_S = 5  # how often rank 0 says whether the data is ready, well under the stall inspector's 60 s
ARRAYS = ("train_signals", "train_labels", "val_signals", "val_labels")


def mnist1d_split(data_cfg):
    """(training signals, training labels, validation signals, validation labels) on every rank: N x 40
    float32 signals and int64 labels, the package's own train/test split of data.num_samples samples."""
    from hvdtrain import core

    making = None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        if core.rank() == 0:
            making = pool.submit(made_or_cached, data_cfg)
        while not core.broadcast_object(making is not None and _finished(making, WAIT_REPORT_S), root_rank=0):
            pass
    return core.broadcast_object(making.result() if making else None, root_rank=0, name="mnist1d")


def _finished(future, seconds):
    """Whether `future` is done, after waiting for it at most `seconds`."""
    return not concurrent.futures.wait([future], seconds).not_done


def made_or_cached(data_cfg):
    """The arrays of data_cfg read from its cache file, or made and written there when the file is
    missing or does not read. Rank 0 only."""
    args = dataset_args(data_cfg)
    path = cache_path(data_cfg.cache_dir, args)
    if path.is_file():
        try:
            return read_cache(path)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            print(f"hvdtrain: MNIST-1D cache {path} does not read ({type(error).__name__}: {error}); making it again",
                  flush=True)
    print(f"hvdtrain: making MNIST-1D ({data_cfg.num_samples} samples, data.seed={data_cfg.seed}) once, about "
          f"{max(1, round(data_cfg.num_samples / SAMPLES_MADE_PER_SECOND))} s; it is kept in {path}", flush=True)
    arrays = make(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    archive = io.BytesIO()
    np.savez(archive, **dict(zip(ARRAYS, arrays)))
    write_atomically(path, archive.getvalue())
    return arrays


def dataset_args(data_cfg):
    """The package's own dataset arguments with the samples and the seed of data_cfg."""
    from mnist1d.data import get_dataset_args

    args = get_dataset_args()
    args.num_samples, args.seed = data_cfg.num_samples, data_cfg.seed
    return args


def cache_path(cache_dir, args):
    """The cache file of these arguments: named by a hash of everything the data depends on."""
    from mnist1d.data import get_templates

    templates = {name: np.asarray(values).tolist() for name, values in get_templates().items()}
    recipe = {"version": importlib.metadata.version("mnist1d"), "templates": templates,
              "args": {name: value for name, value in vars(args).items() if name != "url"}}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"mnist1d-{digest}.npz"


def make(args):
    """The arrays the package makes for `args`. It seeds NumPy's and Python's global generators:
    they are put back, so that a rank's randomness is the same whether it made the data or not."""
    from mnist1d.data import make_dataset

    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        made = make_dataset(args)
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    return (made["x"].astype(np.float32), made["y"].astype(np.int64),
            made["x_test"].astype(np.float32), made["y_test"].astype(np.int64))


def read_cache(path):
    with np.load(path, allow_pickle=False) as archive:
        return tuple(archive[name] for name in ARRAYS)
