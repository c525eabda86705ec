"""The typed schema of a run's configuration, section by section, and the check that stops a bad
one before launch.

Each section is a module of its own holding its dataclass, the values it allows and its check:
recipe, cluster, model, data, optimizer, schedule, train, fault, slurm (with the top-level
`launcher`) and kubernetes. RunConfig puts them together. Hydra composes hvdtrain/conf/ onto it in the `hvdtrain`
command (hvdtrain/launch/compose.py); OmegaConf rejects wrongly typed values there, and `validate`
rejects values that are well typed but wrong (a negative LR, a warmup longer than training, a data
root that is not there), naming every key at fault and what is allowed. Every rank reads the
resolved config that the command wrote into the run directory (hvdtrain/run/run_dir.py) and types it
with `typed`; no rank composes its own.
"""

import hashlib
from dataclasses import dataclass, field
from typing import Optional

from omegaconf import OmegaConf

from hvdtrain.run.config import cluster, data, fault, kubernetes, model, optimizer, recipe, schedule, slurm, train
from hvdtrain.run.config.checks import ConfigError, Problems, invalid
from hvdtrain.run.config.cluster import ClusterConfig
from hvdtrain.run.config.data import DataConfig
from hvdtrain.run.config.fault import FaultConfig
from hvdtrain.run.config.kubernetes import KubernetesConfig
from hvdtrain.run.config.model import ModelConfig
from hvdtrain.run.config.optimizer import OptimizerConfig
from hvdtrain.run.config.recipe import RecipeConfig
from hvdtrain.run.config.schedule import ScheduleConfig
from hvdtrain.run.config.slurm import SlurmConfig
from hvdtrain.run.config.train import TrainConfig

__all__ = ["RunConfig", "ConfigError", "invalid", "validate", "typed", "config_hash", "RESUMABLE_KEYS"]


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
    # local: start the job now, from here; slurm: submit it with sbatch; kubernetes: print its manifests
    launcher: str = "local"
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    dry_run: bool = False
    profile: bool = False  # measure one device's training step (hvdtrain/scaling/profile.py) for the plan's prediction
    resume: Optional[str] = None  # a run directory to continue


# The sections whose keys a recipe or the command line must set, and the order their checks run in.
SECTIONS = (recipe, cluster, model, data, optimizer, schedule, train, slurm, kubernetes, fault)
REQUIRED = ("recipe", "cluster", "model", "data", "optimizer", "schedule", "train")

# What `resume=RUN_DIR` may change of a run: train.epochs extends it; train.device moves it to
# other hardware (a checkpoint holds the same state on any device). Anything else would make it
# another run.
RESUMABLE_KEYS = ("train.epochs", "train.device")


def typed(config):
    """A plain config (a dict, or a loaded YAML) checked against and typed by the schema."""
    return OmegaConf.merge(OmegaConf.structured(RunConfig), config)


def validate(cfg):
    """Raise ConfigError listing every value in `cfg` that cannot run."""
    problems = Problems(cfg)
    for section in REQUIRED:
        for key in _missing_keys(cfg[section], section):
            problems.add(f"{key} is not set: the recipe or the command line must give it")
    problems.raise_any()
    problems.check(not (cfg.profile and cfg.dry_run), "profile",
                   "profile=true measures one device and dry_run=true prints the plan: run them one after the other")
    for section in SECTIONS:
        section.check(cfg, problems)
    problems.raise_any()


def config_hash(cfg):
    """Identifies what a checkpoint was trained with: everything but where and how it was launched
    and supervised."""
    training = {key: value for key, value in OmegaConf.to_container(cfg, resolve=True).items()
                if key not in ("cluster", "fault", "launcher", "slurm", "kubernetes", "dry_run", "profile", "resume")}
    training["train"].pop("preempt_signal", None)  # how a run is stopped, not what it trains
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.create(training)).encode()).hexdigest()[:16]


def _missing_keys(node, prefix):
    for key in node:
        if OmegaConf.is_missing(node, key):
            yield f"{prefix}.{key}"
        elif OmegaConf.is_dict(node[key]):
            yield from _missing_keys(node[key], f"{prefix}.{key}")
