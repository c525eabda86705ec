"""The `data` section: the data sources a recipe can name, each with the kind of input it gives,
and how many training samples the plan can count on before any data is loaded.
hvdtrain/tasks/data_torch.py and data_tensorflow.py build them."""

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import MISSING

from hvdtrain.run.config.model import DEFAULT_MIN_IMAGE_SIZE, MIN_IMAGE_SIZE, MODELS

DATA_SOURCES = {
    "imagefolder": "image",  # a tree data.root/{train,val}/<class>/<image>, as ImageNet is usually laid out
    "synthetic": "image",  # random tensors: throughput measurements without a data set
    "digits": "digits",  # scikit-learn's bundled 8x8 digits (1797 images, 10 classes)
    "mnist1d": "signal",  # MNIST-1D: 40-value signals of 10 digits, made by the mnist1d package (tasks/mnist1d.py)
}

# Where an ImageFolder tree's JPEGs are decoded: in the loader workers with PIL (cpu), or on each
# rank's GPU with nvJPEG, batch by batch (gpu); auto: gpu where the ranks train on CUDA with torch.
DECODERS = ("auto", "cpu", "gpu")
# A file no decoder reads: stop the run naming it, or leave it out and count it.
BAD_FILES = ("stop", "skip")

# The mnist1d package's own train/test split (its get_dataset_args().train_split), which
# hvdtrain keeps: the first 80 % of data.num_samples train.
MNIST1D_TRAIN_SPLIT = 0.8


@dataclass
class DataConfig:
    source: str = MISSING
    root: Optional[str] = None
    train_size: Optional[int] = None  # synthetic: generated; otherwise: expected, for the plan (null: unknown)
    val_size: Optional[int] = None
    image_size: int = 224
    resize_size: int = 256  # validation images are resized to this, then center-cropped to image_size
    loader_workers: int = 0
    decode: str = "auto"  # imagefolder only: DECODERS
    bad_files: str = "stop"  # imagefolder only: BAD_FILES
    # mnist1d only: the samples made (80 % training, 20 % validation: the package's split), the
    # package's seed argument, and the directory rank 0 keeps the made data in.
    num_samples: Optional[int] = None
    seed: Optional[int] = None
    cache_dir: Optional[str] = None


def expected_train_size(data_cfg):
    """(training samples, the key that sets them) before any data is loaded; the size is None
    where it is unknown until the data is read (an ImageFolder tree without data.train_size)."""
    if data_cfg.source == "mnist1d":
        return int(data_cfg.num_samples * MNIST1D_TRAIN_SPLIT), "data.num_samples"
    return data_cfg.train_size, "data.train_size"


def check(cfg, problems):
    data, model = cfg.data, cfg.model
    problems.check(data.source in DATA_SOURCES, "data.source", f"allowed: {', '.join(DATA_SOURCES)}")
    if model.name in MODELS and data.source in DATA_SOURCES:
        takes, gives = MODELS[model.name], DATA_SOURCES[data.source]
        problems.check(takes == gives, "data.source",
                       f"gives {gives} inputs but model {model.name} takes {takes} inputs; data sources for it: "
                       f"{', '.join(source for source, kind in DATA_SOURCES.items() if kind == takes)}")
    if data.source == "imagefolder" and not cfg.dry_run:  # the plan does not read the data
        for problem in _image_folder_problems(data.root):
            problems.add(problem)
    if data.source == "synthetic":
        problems.check(data.train_size is not None, "data.train_size",
                       "synthetic data needs the number of samples to make")
        problems.check(data.val_size is not None, "data.val_size", "synthetic data needs the number of samples to make")
    if data.source in ("digits", "mnist1d"):
        problems.check(model.num_classes == 10, "model.num_classes", f"the {data.source} data set has 10 classes")
    mnist1d = data.source == "mnist1d"
    for key in ("num_samples", "seed", "cache_dir"):
        problems.check((data[key] is not None) == mnist1d, f"data.{key}",
                       "data.source=mnist1d needs it (data=mnist1d sets it)" if mnist1d
                       else "applies to data.source=mnist1d only")
    if mnist1d:
        for key in ("train_size", "val_size"):
            problems.check(data[key] is None, f"data.{key}",
                           "mnist1d's split follows data.num_samples (80 % for training): leave it unset")
        problems.check(data.num_samples is None or (data.num_samples >= 10 and data.num_samples % 10 == 0),
                       "data.num_samples",
                       "must be a positive multiple of 10 (the package makes data.num_samples / 10 samples of each "
                       "digit)")
        problems.check(data.seed is None or 0 <= data.seed < 2**32, "data.seed",
                       "must be in [0, 2**32): the package seeds NumPy with it")
    problems.check(data.train_size is None or data.train_size >= 1, "data.train_size",
                   "must be a positive number or null")
    problems.check(data.val_size is None or data.val_size >= 0, "data.val_size",
                   "must be a number (0: no validation) or null")
    if DATA_SOURCES.get(data.source) == "image":
        smallest = MIN_IMAGE_SIZE.get(model.name, DEFAULT_MIN_IMAGE_SIZE)
        problems.check(data.image_size >= smallest, "data.image_size",
                       f"{model.name} needs images of at least {smallest} pixels")
        problems.check(data.resize_size >= data.image_size, "data.resize_size", "must be at least data.image_size")
    problems.check(data.loader_workers >= 0, "data.loader_workers", "must be 0 (load in the training process) or more")
    problems.check(data.decode in DECODERS, "data.decode", f"allowed: {', '.join(DECODERS)}")
    problems.check(data.bad_files in BAD_FILES, "data.bad_files", f"allowed: {', '.join(BAD_FILES)}")
    if data.decode == "gpu":
        problems.check(data.source == "imagefolder", "data.decode",
                       "gpu decodes the JPEGs of an ImageFolder tree (data.source=imagefolder) only")
        problems.check(cfg.recipe.framework == "torch", "data.decode",
                       "gpu is torch's (torchvision's nvJPEG decoder); TensorFlow decodes with tf.data")
        problems.check(cfg.train.device != "cpu", "data.decode", "gpu needs the ranks to train on CUDA, not "
                       "train.device=cpu")
    problems.check(data.bad_files == "stop" or cfg.recipe.framework == "torch", "data.bad_files",
                   "skip is torch's; TensorFlow's tf.data stops at a file it cannot read")


def decoder(data_cfg, framework, device_kind):
    """(where an ImageFolder tree's images are decoded: "cpu", "gpu", or "auto" until the device
    is known; why, in a few words), or (None, "") for other data."""
    if data_cfg.source != "imagefolder":
        return None, ""
    workers = f"PIL in {data_cfg.loader_workers} loader process{'es' if data_cfg.loader_workers > 1 else ''}" \
        if data_cfg.loader_workers \
        else "PIL in the training process"
    if data_cfg.decode == "cpu":
        return "cpu", f"data.decode=cpu: {workers}"
    if data_cfg.decode == "gpu":
        return "gpu", "data.decode=gpu: nvJPEG on each rank's GPU, batch by batch"
    if framework != "torch":
        return "cpu", "data.decode=auto: TensorFlow decodes with tf.data"
    if device_kind == "auto":
        return "auto", "data.decode=auto: gpu where the ranks train on CUDA, decided as they start"
    if device_kind == "cuda":
        return "gpu", "data.decode=auto: the ranks train on CUDA; nvJPEG on each rank's GPU"
    return "cpu", f"data.decode=auto: the ranks train on the CPU; {workers}"


def _image_folder_problems(root):
    if root is None:
        return ["data.root is not set: pass data.root=/path/to/data (a directory holding train/ and val/)"]
    missing = [split for split in ("train", "val") if not (Path(root) / split).is_dir()]
    if missing:
        return [f"data.root={root!r}: has no {' and no '.join(s + '/' for s in missing)} directory "
                f"(an ImageFolder tree needs {Path(root) / 'train'} and {Path(root) / 'val'})"]
    return []
