"""The `schedule` section: the learning rate as a function of how far training has got, in
epochs (fractional), and the keys that shape it. Adding a decay is one entry in DECAYS_BY_EPOCH
or DECAYS_TO_THE_END (and, for users, a file in conf/schedule/).

Warmup (Goyal et al. 2017, section 2.2) over `warmup_epochs`, as `schedule.warmup` says: gradual,
from the base LR at the first iteration up to the peak LR by the same amount every iteration;
constant, the base LR throughout the warmup and then the peak at once; none, the peak LR from the
first iteration (the warmup's length is then 0, whatever warmup_epochs says, so that one sweep
over schedule.warmup compares the three). Then the decay: the decays by epoch (constant, step,
multistep) count epochs from the start of training, as the published schedules do; the decays to
the end (cosine, poly) run from the end of the warmup to the end of training.

So extending a run (`hvdtrain resume=DIR train.epochs=N`) leaves a decay by epoch as it is: the
extended run trains on exactly as one started with N epochs. A decay to the end is stretched to
end at epoch N instead: from where the run stands its LR follows the N-epoch curve (it rises again
from the final LR the finished run had reached), while the epochs done keep the LR they were
trained with, so the result is not that of a run started with N.
"""

import math
from dataclasses import dataclass, field
from typing import List

WARMUPS = ("gradual", "constant", "none")

# decay -> the peak LR's factor at `progress` epochs since the start of training
DECAYS_BY_EPOCH = {
    "constant": lambda progress, schedule: 1.0,
    "step": lambda progress, schedule: schedule.gamma ** math.floor(progress / schedule.step_epochs),
    "multistep": lambda progress, schedule: schedule.gamma ** sum(progress >= milestone
                                                                  for milestone in schedule.milestones),
}
# decay -> how far the LR still stands above schedule.final_lr, as a share of the peak's height
# above it, when `done` (0 to 1) of the epochs after warmup are trained: shaped by train.epochs
DECAYS_TO_THE_END = {
    "cosine": lambda done, schedule: 0.5 * (1 + math.cos(math.pi * done)),
    "poly": lambda done, schedule: (1 - done) ** schedule.power,
}
DECAYS = (*DECAYS_BY_EPOCH, *DECAYS_TO_THE_END)


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


def warmup_length(schedule):
    """The epochs of warmup the schedule really has."""
    return 0.0 if schedule.warmup == "none" else schedule.warmup_epochs


def learning_rate(progress, schedule, base_lr, peak_lr, epochs):
    """The LR at `progress` epochs into training (epoch + step / steps_per_epoch) of `epochs`."""
    warmup_epochs = warmup_length(schedule)
    if progress < warmup_epochs:
        if schedule.warmup == "constant":
            return base_lr
        return base_lr + (peak_lr - base_lr) * progress / warmup_epochs
    if schedule.decay in DECAYS_BY_EPOCH:
        return peak_lr * DECAYS_BY_EPOCH[schedule.decay](progress, schedule)
    done = (progress - warmup_epochs) / max(epochs - warmup_epochs, 1e-12)
    done = min(max(done, 0.0), 1.0)
    shape = DECAYS_TO_THE_END[schedule.decay](done, schedule)
    return schedule.final_lr + (peak_lr - schedule.final_lr) * shape


def check(cfg, problems):
    schedule, epochs = cfg.schedule, cfg.train.epochs
    problems.check(0 <= schedule.warmup_epochs <= epochs, "schedule.warmup_epochs",
                   f"must be between 0 and the length of training (train.epochs={epochs})")
    problems.check(schedule.warmup in WARMUPS, "schedule.warmup", f"allowed: {', '.join(WARMUPS)}")
    problems.check(schedule.decay in DECAYS, "schedule.decay", f"allowed: {', '.join(DECAYS)}")
    milestones = list(schedule.milestones)
    problems.check(all(m > 0 for m in milestones) and milestones == sorted(set(milestones)), "schedule.milestones",
                   "must be positive epochs in increasing order")
    problems.check(schedule.decay != "multistep" or milestones, "schedule.milestones",
                   "multistep decay needs milestones")
    problems.check(0 < schedule.gamma <= 1, "schedule.gamma", "must be in (0, 1]")
    problems.check(schedule.step_epochs > 0, "schedule.step_epochs", "must be positive")
    problems.check(schedule.power > 0, "schedule.power", "must be positive")
    problems.check(schedule.final_lr >= 0, "schedule.final_lr", "must not be negative")
