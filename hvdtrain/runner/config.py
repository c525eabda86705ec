"""The typed schema of a run's configuration, and the checks that stop a bad one before launch.

Hydra composes `conf/config.yaml`, the config groups in `conf/` and one recipe from `conf/recipe/`
onto `RunConfig`; OmegaConf rejects wrongly typed values while composing, `unknown_key_problem`
names a key the schema does not have (Hydra's `+key=value` would add it), and `validate` rejects
values that are well typed but wrong (a negative LR, a warmup longer than training, a data root
that is not there), naming the key and what is allowed.
"""

import dataclasses
import difflib
import hashlib
import importlib.util
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import MISSING, OmegaConf

from hvdtrain import tasks
from hvdtrain.runner.scaling import NETWORK_STEP_LATENCY_US
from hvdtrain.training.lr_schedule import WARMUPS

PACKAGE_DIR = Path(__file__).resolve().parent.parent
CONF_DIR = PACKAGE_DIR / "conf"  # shipped inside the package, so that any install has the recipes
RECIPES_DIR = CONF_DIR / "recipe"

FRAMEWORKS = ("torch", "tensorflow")
TARGET_METRICS = ("val_top1", "val_top5")  # accuracies in percent: higher is better
DECAYS = ("constant", "step", "multistep", "cosine", "poly")
OPTIMIZERS = ("sgd", "lars")
PARAMETER_KINDS = ("bn", "bias")  # what optimizer.exclude_from_weight_decay and exclude_from_adaptation may name
DEVICES = ("auto", "cpu", "cuda")
RANK_LAUNCHERS = ("mpirun", "srun")  # cluster.launcher: what starts the ranks
LAUNCHERS = ("local", "slurm")  # launcher: start the job from here now, or submit it to Slurm
PREEMPT_SIGNALS = ("USR1", "USR2", "TERM")  # train.preempt_signal, by its name without SIG
AUTOCAST_MODES = ("none", "bf16", "fp16")


@dataclass
class TargetConfig:
    metric: str = MISSING  # one of TARGET_METRICS
    value: float = MISSING
    source: str = MISSING  # where the published number comes from


@dataclass
class ReferenceThroughputConfig:
    """A published training throughput of one device, from which the plan predicts scaling when
    no profile (profile=true) has measured one. It holds for its model and per-worker batch only."""
    samples_per_s: float = MISSING
    model: str = MISSING  # model.name
    batch_size: int = MISSING  # train.batch_size
    device: str = MISSING  # what it was measured on, e.g. "NVIDIA Tesla P100"
    source: str = MISSING


@dataclass
class RecipeConfig:
    name: str = MISSING
    framework: str = "torch"
    description: str = ""
    target: Optional[TargetConfig] = None
    reference_throughput: Optional[ReferenceThroughputConfig] = None


@dataclass
class NetworkConfig:
    """The links the plan predicts scaling with (scaling.py)."""
    gbps: Optional[float] = None  # between hosts, Gbit/s; null: unknown
    latency_us: Optional[float] = NETWORK_STEP_LATENCY_US  # between hosts, per ring step; null: unknown
    # Between the ranks of one host; null: the device's usual link (scaling.WITHIN_HOST: PCIe 3.0
    # x16 for GPUs, shared memory for CPU ranks).
    within_gbps: Optional[float] = None
    within_latency_us: Optional[float] = None


@dataclass
class ClusterConfig:
    name: str = MISSING
    num_hosts: int = 1
    slots: int = 1  # ranks per host
    hosts: List[str] = field(default_factory=list)  # "name" or "name:slots"
    hostfile: Optional[str] = None
    mpirun_args: List[str] = field(default_factory=list)
    # What starts the ranks: mpirun (inside a Slurm allocation, Open MPI starts its daemons with
    # Slurm's own launcher), or srun, which starts every rank as a task of a Slurm job step
    launcher: str = "mpirun"
    network: NetworkConfig = field(default_factory=NetworkConfig)


@dataclass
class ModelConfig:
    name: str = MISSING
    num_classes: int = 1000
    zero_init_residual: bool = False  # Goyal et al.: gamma = 0 in the last BN of every residual block


@dataclass
class DataConfig:
    source: str = MISSING
    root: Optional[str] = None
    train_size: Optional[int] = None  # synthetic: generated; otherwise: expected, for the plan (null: unknown)
    val_size: Optional[int] = None
    image_size: int = 224
    resize_size: int = 256  # validation images are resized to this, then center-cropped to image_size
    loader_workers: int = 0
    # mnist1d only: the samples made (80 % training, 20 % validation: the package's split), the
    # package's seed argument, and the directory rank 0 keeps the made data in.
    num_samples: Optional[int] = None
    seed: Optional[int] = None
    cache_dir: Optional[str] = None


@dataclass
class OptimizerConfig:
    name: str = "sgd"
    base_lr: float = 0.1  # the LR for base_batch_size; scaled linearly to the global batch
    base_batch_size: int = 256
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0001
    exclude_from_weight_decay: List[str] = field(default_factory=list)  # of "bn", "bias"
    momentum_correction: bool = True
    trust_coefficient: Optional[float] = None  # lars only: eta of the layer-wise trust ratio
    exclude_from_adaptation: List[str] = field(default_factory=list)  # lars only: "bn", "bias" take plain SGD


@dataclass
class ScheduleConfig:
    warmup_epochs: float = 0.0
    warmup: str = "gradual"  # gradual: per iteration from base_lr to the peak LR; constant: base_lr, then the peak; none
    decay: str = "constant"
    milestones: List[float] = field(default_factory=list)  # multistep: epochs where the LR is multiplied by gamma
    step_epochs: float = 30.0  # step: the LR is multiplied by gamma every step_epochs
    gamma: float = 0.1
    power: float = 2.0  # poly
    final_lr: float = 0.0  # cosine and poly end here


@dataclass
class TrainConfig:
    epochs: int = 1
    batch_size: int = 32  # per worker and backward pass
    backward_passes_per_step: int = 1
    # none | bf16 | fp16: the precision of the forward pass (torch.autocast; Keras's mixed_bfloat16
    # policy for tensorflow), with a GradScaler for fp16. fp16 needs CUDA: it is refused with
    # train.device=cpu, and where train.device=auto comes out as the CPU (checked before launch on
    # this machine, by the ranks at start elsewhere), as the CPU's float16 autocast without loss
    # scaling is not what anyone means. tensorflow takes bf16 only (its loop has no loss scaling).
    # true/false are kept for older configs: false = none; true = fp16 on CUDA and bf16 on the CPU
    # for torch, bf16 for tensorflow. Typed Any so that those booleans stay booleans.
    autocast: Any = "none"
    device: str = "auto"  # auto | cpu | cuda; one GPU per local rank; auto: CUDA where every host has a GPU per rank
    channels_last: bool = False  # image models: weights and inputs in torch.channels_last (tensorflow's layout anyway)
    cudnn_benchmark: bool = True  # on CUDA, cuDNN times its algorithms for each new input shape (torch)
    seed: int = 0
    log_every_steps: int = 10
    eval_every_epochs: int = 1
    checkpoint_every_steps: int = 0  # 0: at the end of each epoch only
    # ... and at the first logged step (train.log_every_steps) this many seconds after the last
    # checkpoint, so that a restart (fault.*) loses at most about this much; 0: off
    checkpoint_every_s: float = 600.0
    keep_checkpoints: int = 3
    # Besides SIGTERM inside a Slurm job: the signal that asks the run to stop at the next logged
    # step with a checkpoint (a scheduler's notice ahead of a time limit or a preemption,
    # `#SBATCH --signal=USR1@120`); null: none
    preempt_signal: Optional[str] = "USR1"


KEEP_GLOBAL_BATCH_BY = ("backward_passes", "batch_size")


@dataclass
class FaultConfig:
    """What `hvdtrain` does when the job it launched fails (runner/supervisor.py)."""
    max_restarts: int = 3  # restarts from the newest checkpoint after failures a restart can fix
    restart_wait_s: float = 5.0  # the wait before the first restart; it doubles with each one
    # A job without a training step for this long is stopped and restarted; the ranks' stall
    # inspector gets it as HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, to name the stalled ranks first. 0: never
    stall_shutdown_s: float = 600.0
    # Hosts that no longer answer the remote agent before a restart are left out while at least
    # this many remain (null: all are needed), and the job goes on with the same global batch:
    keep_global_batch: str = "backward_passes"  # ... by train.backward_passes_per_step, or by train.batch_size
    # where neither keeps it exactly: true trains on with the global batch the remaining ranks
    # make, at the linear rule's LR for it; false stops
    allow_rescale: bool = False
    min_hosts: Optional[int] = None


@dataclass
class SlurmConfig:
    """The batch job that `launcher=slurm` writes into the run directory and submits with sbatch."""
    partition: Optional[str] = None
    time: Optional[str] = None  # the job's time limit, as sbatch takes it: "MINUTES", "HH:MM:SS", "D-HH:MM:SS"
    account: Optional[str] = None
    gpus_per_node: int = 0
    # train.preempt_signal is sent this many seconds before the time limit: the run checkpoints,
    # stops, and requeues its job, which resumes it (0: no signal ahead of the limit)
    signal_before_s: int = 120
    requeue: bool = True  # the job may be requeued (preemption, scontrol requeue) and then resumes
    sbatch_lines: List[str] = field(default_factory=list)  # more sbatch options, e.g. ["--qos=high"]


@dataclass
class RunConfig:
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    launcher: str = "local"  # local: start the job now, from here; slurm: submit it with sbatch
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    dry_run: bool = False
    profile: bool = False  # measure one device's training step (profiling.py) for the plan's prediction
    resume: Optional[str] = None  # a run directory to continue


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key and what is allowed."""


def invalid(problem):
    """The ConfigError for one problem; `hvdtrain` prints it as `hvdtrain: invalid config: PROBLEM`."""
    return ConfigError(f"invalid config: {problem}")


def _schema_keys(section=RunConfig, prefix=""):
    """Every key of the schema, dotted ('train.epochs', sections too), with its declared type."""
    keys = {}
    for name, annotation in typing.get_type_hints(section).items():
        keys[prefix + name] = annotation
        inner = _section_type(annotation)
        if inner is not None:
            keys.update(_schema_keys(inner, f"{prefix}{name}."))
    return keys


def _section_type(annotation):
    """The dataclass of a section's annotation (`TargetConfig` for Optional[TargetConfig]), else None."""
    return next((candidate for candidate in (annotation, *typing.get_args(annotation))
                 if dataclasses.is_dataclass(candidate)), None)


SCHEMA_KEYS = _schema_keys()


def unknown_key_problem(key):
    """None if the schema has `key`; else a line naming it and the nearest known key, or, when none
    is near, the keys of the section it was meant for."""
    if key in SCHEMA_KEYS:
        return None
    parts = key.split(".")
    known_depth = next(depth for depth in range(len(parts)) if ".".join(parts[:depth + 1]) not in SCHEMA_KEYS)
    section = ".".join(parts[:known_depth])
    prefix = section + "." if section else ""
    # Compare only below the section that is right, so that `optimizer.bogus` is not taken for
    # `optimizer.base_lr` just because both begin with `optimizer.`.
    below = [known[len(prefix):] for known in SCHEMA_KEYS if known.startswith(prefix)]
    nearest = difflib.get_close_matches(".".join(parts[known_depth:]), below, n=1)
    if nearest:
        return f"{key}: unknown key; did you mean {prefix}{nearest[0]}?"
    children = [name for name in below if "." not in name]
    return f"{key}: unknown key; the keys {'of ' + section if section else 'at the top level'}: {', '.join(children)}"


def allowed_values(key):
    """What the schema lets `key` hold, as the end of an error line ('must be an integer')."""
    annotation = SCHEMA_KEYS[key]
    if _section_type(annotation) is not None:
        children = [known for known in SCHEMA_KEYS if known.rpartition(".")[0] == key]
        return f"is a section; set its keys instead: {', '.join(children)}"
    return f"must be {_describe_type(annotation)}"


# How an error line names a value of each type, and several of them in a list.
_TYPE_NAMES = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans"),
               str: ("a string", "strings")}


def _describe_type(annotation):
    arguments = [argument for argument in typing.get_args(annotation) if argument is not type(None)]
    if typing.get_origin(annotation) is typing.Union:
        return f"{_describe_type(arguments[0])} or null"
    if typing.get_origin(annotation) is list:
        return f"a list of {_TYPE_NAMES[arguments[0]][1]}, written [x,y,...]"
    return _TYPE_NAMES[annotation][0]


# mpirun hands the workers' stderr on through a pipe, so a worker cannot tell whether a terminal
# shows it: the `hvdtrain` command, which can, says so in this variable.
PROGRESS_BAR_VARIABLE = "HVDTRAIN_PROGRESS_BAR"


def progress_bar_wanted(environ):
    """Whether rank 0 draws a progress bar (HVDTRAIN_PROGRESS_BAR=1) or writes a line a record
    (0); unset, as in a job started by another launcher, whether stderr is a terminal."""
    setting = environ.get(PROGRESS_BAR_VARIABLE)
    if setting is None:
        return sys.stderr.isatty()
    if setting not in ("0", "1"):
        raise ConfigError(f"environment variable {PROGRESS_BAR_VARIABLE} must be 0 or 1, got {setting!r}")
    return setting == "1"


def register_configs():
    """Put the schema into Hydra's ConfigStore. The recipes are the group `recipe` (conf/recipe/);
    each one is global (`# @package _global_`), so that it can set any key and choose the other
    groups (`override /model: resnet50`)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="run_schema", node=RunConfig)


LAYOUT = re.compile(r"(\d+)x(\d+)")  # cluster=HOSTSxSLOTS


def register_layouts(overrides, config_dir=None):
    """Put every layout `cluster=HOSTSxSLOTS` that `overrides` choose (a sweep's too) into Hydra's
    ConfigStore, unless a file cluster/HOSTSxSLOTS.yaml has it (in hvdtrain/conf or Hydra's
    --config-dir `config_dir`): any layout works without a file of its own. Zero hosts or slots
    are registered all the same, for validate() to refuse by name."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.key_or_group != "cluster":
            continue
        if override.value_type == ValueType.ELEMENT:
            choices = [override.get_value_element_as_str()]
        elif override.value_type in (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP):
            choices = list(override.sweep_string_iterator())
        else:
            continue
        for choice in choices:
            layout = LAYOUT.fullmatch(choice)
            files = [Path(folder) / "cluster" / f"{choice}.yaml" for folder in (CONF_DIR, config_dir) if folder]
            if layout and not any(file.is_file() for file in files):
                ConfigStore.instance().store(group="cluster", name=choice,
                                             node={"num_hosts": int(layout[1]), "slots": int(layout[2])})


def typed(config):
    """A plain config (a dict, or a loaded YAML) checked against and typed by the schema."""
    return OmegaConf.merge(OmegaConf.structured(RunConfig), config)


def load_run_config(path):
    """A run directory's resolved config.yaml, typed by the schema."""
    return typed(OmegaConf.load(path))


# What `resume=RUN_DIR` may change of a run: train.epochs extends it; train.device moves it to
# other hardware (a checkpoint holds the same state on any device). Anything else would make it
# another run.
RESUMABLE_KEYS = ("train.epochs", "train.device")


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
    from hvdtrain.training.checkpoint import write_atomically  # which imports this module

    saved = OmegaConf.load(path)
    if all(OmegaConf.select(saved, key) == value for key, value in values.items()):
        return
    for key, value in values.items():
        OmegaConf.update(saved, key, value)
    write_atomically(path, OmegaConf.to_yaml(saved).encode())


def autocast_precision(cfg, device_kind):
    """What train.autocast asks for on `device_kind` ("cpu" or "cuda"): "none", "bf16" or "fp16".
    The booleans of older configs mean what they meant then (see TrainConfig.autocast)."""
    setting = cfg.train.autocast
    if setting is True:
        return "fp16" if device_kind == "cuda" and cfg.recipe.framework == "torch" else "bf16"
    if setting is False:
        return "none"
    return setting


def config_hash(cfg):
    """Identifies what a checkpoint was trained with: everything but where and how it was launched
    and supervised."""
    training = {key: value for key, value in OmegaConf.to_container(cfg, resolve=True).items()
                if key not in ("cluster", "fault", "launcher", "slurm", "dry_run", "profile", "resume")}
    training["train"].pop("preempt_signal", None)  # how a run is stopped, not what it trains
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.create(training)).encode()).hexdigest()[:16]


def validate(cfg):
    """Raise ConfigError listing every value in `cfg` that cannot run."""
    problems = []

    def check(ok, key, message):
        if not ok:
            value = OmegaConf.select(cfg, key, throw_on_missing=False)
            problems.append(f"{key}={value!r}: {message}")

    for section in ("recipe", "cluster", "model", "data", "optimizer", "schedule", "train"):
        for key in _missing_keys(cfg[section], section):
            problems.append(f"{key} is not set: the recipe or the command line must give it")
    if problems:
        raise ConfigError(_listing(problems))

    recipe, model, data, optimizer, schedule, train = (
        cfg.recipe, cfg.model, cfg.data, cfg.optimizer, cfg.schedule, cfg.train)
    check(recipe.framework in FRAMEWORKS, "recipe.framework", f"allowed: {', '.join(FRAMEWORKS)}")
    check(recipe.framework not in FRAMEWORKS or importlib.util.find_spec(f"hvdtrain.training.train_{recipe.framework}"),
          "recipe.framework", f"no training loop for it yet (hvdtrain/training/train_{recipe.framework}.py)")
    if recipe.target is not None:
        check(recipe.target.metric in TARGET_METRICS, "recipe.target.metric", f"allowed: {', '.join(TARGET_METRICS)}")

    check(cfg.cluster.num_hosts >= 1, "cluster.num_hosts", "must be at least 1")
    check(cfg.cluster.slots >= 1, "cluster.slots", "must be at least 1 rank per host")
    network = cfg.cluster.network
    for key in ("gbps", "within_gbps"):
        check(network[key] is None or network[key] > 0, f"cluster.network.{key}", "must be a positive Gbit/s or null")
    for key in ("latency_us", "within_latency_us"):
        check(network[key] is None or network[key] >= 0, f"cluster.network.{key}",
              "must be microseconds (0 or more) or null")
    if recipe.reference_throughput is not None:
        check(recipe.reference_throughput.samples_per_s > 0, "recipe.reference_throughput.samples_per_s",
              "must be a positive throughput of one device")
    check(not (cfg.profile and cfg.dry_run), "profile",
          "profile=true measures one device and dry_run=true prints the plan: run them one after the other")

    check(model.name in tasks.MODELS, "model.name", f"unknown model; allowed: {', '.join(tasks.MODELS)}")
    check(model.num_classes >= 2, "model.num_classes", "must be at least 2")
    check(not model.zero_init_residual or model.name in tasks.RESIDUAL_MODELS, "model.zero_init_residual",
          f"applies to residual networks only ({', '.join(tasks.RESIDUAL_MODELS)}), not {model.name}")

    check(data.source in tasks.DATA_SOURCES, "data.source", f"allowed: {', '.join(tasks.DATA_SOURCES)}")
    if model.name in tasks.MODELS and data.source in tasks.DATA_SOURCES:
        check(tasks.MODELS[model.name] == tasks.DATA_SOURCES[data.source], "data.source",
              f"gives {tasks.DATA_SOURCES[data.source]} inputs but model {model.name} takes "
              f"{tasks.MODELS[model.name]} inputs; data sources for it: "
              f"{', '.join(s for s, kind in tasks.DATA_SOURCES.items() if kind == tasks.MODELS[model.name])}")
    if data.source == "imagefolder" and not cfg.dry_run:  # the plan does not read the data
        problems += _image_folder_problems(data.root)
    if data.source == "synthetic":
        check(data.train_size is not None, "data.train_size", "synthetic data needs the number of samples to make")
        check(data.val_size is not None, "data.val_size", "synthetic data needs the number of samples to make")
    if data.source in ("digits", "mnist1d"):
        check(model.num_classes == 10, "model.num_classes", f"the {data.source} data set has 10 classes")
    mnist1d = data.source == "mnist1d"
    for key in ("num_samples", "seed", "cache_dir"):
        check((data[key] is not None) == mnist1d, f"data.{key}", "data.source=mnist1d needs it (data=mnist1d sets it)"
              if mnist1d else "applies to data.source=mnist1d only")
    if mnist1d:
        for key in ("train_size", "val_size"):
            check(data[key] is None, f"data.{key}",
                  "mnist1d's split follows data.num_samples (80 % for training): leave it unset")
        check(data.num_samples is None or (data.num_samples >= 10 and data.num_samples % 10 == 0), "data.num_samples",
              "must be a positive multiple of 10 (the package makes data.num_samples / 10 samples of each digit)")
        check(data.seed is None or 0 <= data.seed < 2**32, "data.seed",
              "must be in [0, 2**32): the package seeds NumPy with it")
    check(data.train_size is None or data.train_size >= 1, "data.train_size", "must be a positive number or null")
    check(data.val_size is None or data.val_size >= 0, "data.val_size", "must be a number (0: no validation) or null")
    if tasks.DATA_SOURCES.get(data.source) == "image":
        smallest = tasks.MIN_IMAGE_SIZE.get(model.name, tasks.DEFAULT_MIN_IMAGE_SIZE)
        check(data.image_size >= smallest, "data.image_size", f"{model.name} needs images of at least {smallest} pixels")
        check(data.resize_size >= data.image_size, "data.resize_size", "must be at least data.image_size")
    check(data.loader_workers >= 0, "data.loader_workers", "must be 0 (load in the training process) or more")

    check(optimizer.name in OPTIMIZERS, "optimizer.name", f"allowed: {', '.join(OPTIMIZERS)}")
    check(optimizer.base_lr > 0, "optimizer.base_lr", "must be a positive learning rate")
    check(optimizer.base_batch_size >= 1, "optimizer.base_batch_size", "must be a positive batch size")
    check(0 <= optimizer.momentum < 1, "optimizer.momentum", "must be in [0, 1)")
    check(not optimizer.nesterov or optimizer.momentum > 0, "optimizer.nesterov", "needs optimizer.momentum > 0")
    check(optimizer.weight_decay >= 0, "optimizer.weight_decay", "must not be negative")
    for key in ("exclude_from_weight_decay", "exclude_from_adaptation"):
        check(set(optimizer[key]) <= set(PARAMETER_KINDS), f"optimizer.{key}",
              f"allowed entries: {', '.join(PARAMETER_KINDS)}")
    lars = optimizer.name == "lars"
    check(not lars or (optimizer.trust_coefficient is not None and optimizer.trust_coefficient > 0),
          "optimizer.trust_coefficient", "must be a positive number (LARS's eta, e.g. 0.001)")
    check(not lars or recipe.framework != "tensorflow", "optimizer.name",
          "LARS is implemented for recipe.framework=torch only; the tensorflow loop has SGD")
    check(lars or optimizer.trust_coefficient is None, "optimizer.trust_coefficient", "applies to optimizer=lars only")
    check(lars or not optimizer.exclude_from_adaptation, "optimizer.exclude_from_adaptation",
          "applies to optimizer=lars only")

    check(train.epochs >= 1, "train.epochs", "must be at least 1")
    check(0 <= schedule.warmup_epochs <= train.epochs, "schedule.warmup_epochs",
          f"must be between 0 and the length of training (train.epochs={train.epochs})")
    check(schedule.warmup in WARMUPS, "schedule.warmup", f"allowed: {', '.join(WARMUPS)}")
    check(schedule.decay in DECAYS, "schedule.decay", f"allowed: {', '.join(DECAYS)}")
    milestones = list(schedule.milestones)
    check(all(m > 0 for m in milestones) and milestones == sorted(set(milestones)), "schedule.milestones",
          "must be positive epochs in increasing order")
    check(schedule.decay != "multistep" or milestones, "schedule.milestones", "multistep decay needs milestones")
    check(0 < schedule.gamma <= 1, "schedule.gamma", "must be in (0, 1]")
    check(schedule.step_epochs > 0, "schedule.step_epochs", "must be positive")
    check(schedule.power > 0, "schedule.power", "must be positive")
    check(schedule.final_lr >= 0, "schedule.final_lr", "must not be negative")

    check(train.batch_size >= 1, "train.batch_size", "must be a positive number of samples per worker")
    check(train.backward_passes_per_step >= 1, "train.backward_passes_per_step", "must be at least 1")
    check(train.device in DEVICES, "train.device", f"allowed: {', '.join(DEVICES)}")
    check(isinstance(train.autocast, bool) or train.autocast in AUTOCAST_MODES, "train.autocast",
          f"allowed: {', '.join(AUTOCAST_MODES)} (true/false kept for older configs)")
    if train.autocast == "fp16":
        check(recipe.framework != "tensorflow", "train.autocast",
              "the tensorflow loop has no loss scaling; use bf16 (Keras's mixed_bfloat16 policy)")
        check(train.device != "cpu", "train.autocast",
              "float16 autocast is for CUDA, with a GradScaler; on the CPU (train.device=cpu) use bf16")
    image_models = [name for name, kind in tasks.MODELS.items() if kind == "image"]
    check(not train.channels_last or tasks.MODELS.get(model.name) == "image", "train.channels_last",
          f"applies to image models ({', '.join(image_models)}), not {model.name}")
    check(train.log_every_steps >= 1, "train.log_every_steps", "must be at least 1")
    check(train.eval_every_epochs >= 1, "train.eval_every_epochs", "must be at least 1")
    check(train.checkpoint_every_steps >= 0, "train.checkpoint_every_steps", "must be 0 (epoch ends only) or more")
    check(train.keep_checkpoints >= 1, "train.keep_checkpoints", "must keep at least 1")
    check(train.checkpoint_every_s >= 0, "train.checkpoint_every_s", "must be 0 (off) or a number of seconds")
    check(train.preempt_signal is None or train.preempt_signal in PREEMPT_SIGNALS, "train.preempt_signal",
          f"allowed: {', '.join(PREEMPT_SIGNALS)} (a signal's name without SIG), or null")
    check(cfg.cluster.launcher in RANK_LAUNCHERS, "cluster.launcher", f"allowed: {', '.join(RANK_LAUNCHERS)}")
    check(cfg.launcher in LAUNCHERS, "launcher", f"allowed: {', '.join(LAUNCHERS)}")
    slurm = cfg.slurm
    check(slurm.gpus_per_node >= 0, "slurm.gpus_per_node", "must be 0 or more")
    check(slurm.signal_before_s >= 0, "slurm.signal_before_s", "must be 0 (no signal) or a number of seconds")
    check(not slurm.time or re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", slurm.time), "slurm.time",
          "must be a time limit as sbatch takes it: MINUTES, HH:MM:SS or D-HH:MM:SS")
    for line in slurm.sbatch_lines:
        check(line.startswith("-"), "slurm.sbatch_lines", f"{line!r} is not an sbatch option (such as --qos=high)")
    fault = cfg.fault
    check(fault.max_restarts >= 0, "fault.max_restarts", "must be 0 (never restart) or more")
    check(fault.restart_wait_s >= 0, "fault.restart_wait_s", "must not be negative")
    check(fault.stall_shutdown_s >= 0, "fault.stall_shutdown_s", "must be 0 (never) or a number of seconds")
    check(fault.keep_global_batch in KEEP_GLOBAL_BATCH_BY, "fault.keep_global_batch",
          f"allowed: {', '.join(KEEP_GLOBAL_BATCH_BY)}")
    check(fault.min_hosts is None or 1 <= fault.min_hosts <= cfg.cluster.num_hosts, "fault.min_hosts",
          f"must be between 1 and the layout's {cfg.cluster.num_hosts} hosts, or null (all of them)")
    if problems:
        raise ConfigError(_listing(problems))


def _image_folder_problems(root):
    if root is None:
        return ["data.root is not set: pass data.root=/path/to/data (a directory holding train/ and val/)"]
    missing = [split for split in ("train", "val") if not (Path(root) / split).is_dir()]
    if missing:
        return [f"data.root={root!r}: has no {' and no '.join(s + '/' for s in missing)} directory "
                f"(an ImageFolder tree needs {Path(root) / 'train'} and {Path(root) / 'val'})"]
    return []


def _missing_keys(node, prefix):
    for key in node:
        if OmegaConf.is_missing(node, key):
            yield f"{prefix}.{key}"
        elif OmegaConf.is_dict(node[key]):
            yield from _missing_keys(node[key], f"{prefix}.{key}")


def _listing(problems):
    if len(problems) == 1:
        return f"invalid config: {problems[0]}"
    return "invalid config:\n" + "\n".join(f"  {p}" for p in problems)
