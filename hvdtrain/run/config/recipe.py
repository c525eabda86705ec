"""The `recipe` section: what a run reproduces, with which framework, and the published result
and throughput it is held against."""

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

FRAMEWORKS = ("torch", "tensorflow")  # each has its training loop: hvdtrain/training/train_<framework>.py
TARGET_METRICS = ("val_top1", "val_top5")  # accuracies in percent: higher is better


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


def check(cfg, problems):
    recipe = cfg.recipe
    problems.check(recipe.framework in FRAMEWORKS, "recipe.framework", f"allowed: {', '.join(FRAMEWORKS)}")
    if recipe.target is not None:
        problems.check(recipe.target.metric in TARGET_METRICS, "recipe.target.metric",
                       f"allowed: {', '.join(TARGET_METRICS)}")
    if recipe.reference_throughput is not None:
        problems.check(recipe.reference_throughput.samples_per_s > 0, "recipe.reference_throughput.samples_per_s",
                       "must be a positive throughput of one device")
