"""The `optimizer` section: momentum SGD or LARS, its LR given for a base batch and scaled
linearly to the global batch (Goyal et al. 2017), and which parameters skip weight decay or
LARS's layer-wise adaptation. train_torch.build_optimizer and train_tensorflow.SGD build it."""

from dataclasses import dataclass, field
from typing import List, Optional

OPTIMIZERS = ("sgd", "lars")
PARAMETER_KINDS = ("bn", "bias")  # what exclude_from_weight_decay and exclude_from_adaptation may name


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


def check(cfg, problems):
    optimizer = cfg.optimizer
    problems.check(optimizer.name in OPTIMIZERS, "optimizer.name", f"allowed: {', '.join(OPTIMIZERS)}")
    problems.check(optimizer.base_lr > 0, "optimizer.base_lr", "must be a positive learning rate")
    problems.check(optimizer.base_batch_size >= 1, "optimizer.base_batch_size", "must be a positive batch size")
    problems.check(0 <= optimizer.momentum < 1, "optimizer.momentum", "must be in [0, 1)")
    problems.check(not optimizer.nesterov or optimizer.momentum > 0, "optimizer.nesterov", "needs optimizer.momentum > 0")
    problems.check(optimizer.weight_decay >= 0, "optimizer.weight_decay", "must not be negative")
    for key in ("exclude_from_weight_decay", "exclude_from_adaptation"):
        problems.check(set(optimizer[key]) <= set(PARAMETER_KINDS), f"optimizer.{key}",
                       f"allowed entries: {', '.join(PARAMETER_KINDS)}")
    lars = optimizer.name == "lars"
    problems.check(not lars or (optimizer.trust_coefficient is not None and optimizer.trust_coefficient > 0),
                   "optimizer.trust_coefficient", "must be a positive number (LARS's eta, e.g. 0.001)")
    problems.check(not lars or cfg.recipe.framework != "tensorflow", "optimizer.name",
                   "LARS is implemented for recipe.framework=torch only; the tensorflow loop has SGD")
    problems.check(lars or optimizer.trust_coefficient is None, "optimizer.trust_coefficient",
                   "applies to optimizer=lars only")
    problems.check(lars or not optimizer.exclude_from_adaptation, "optimizer.exclude_from_adaptation",
                   "applies to optimizer=lars only")
