"""The learning rate as a function of how far training has got, in epochs (fractional).

Warmup (Goyal et al. 2017, section 2.2) over `warmup_epochs`, as `schedule.warmup` says: gradual,
from the base LR at the first iteration up to the peak LR by the same amount every iteration;
constant, the base LR throughout the warmup and then the peak at once; none, the peak LR from the
first iteration (the warmup's length is then 0, whatever warmup_epochs says, so that one sweep
over schedule.warmup compares the three). Then the decay: step and
multistep count epochs from the start of training (as the published schedules do), cosine and
poly run from the end of the warmup to the end of training.

So extending a run (`hvdtrain resume=DIR train.epochs=N`) leaves a constant, step or multistep
schedule as it is: the extended run trains on exactly as one started with N epochs. A cosine or
poly decay is stretched to end at epoch N instead: from where the run stands its LR follows the
N-epoch curve (it rises again from the final LR the finished run had reached), while the epochs
done keep the LR they were trained with, so the result is not that of a run started with N.
"""

import math

DECAYS_TO_THE_END = ("cosine", "poly")  # shaped by train.epochs; the others by the epoch alone


WARMUPS = ("gradual", "constant", "none")


def warmup_length(schedule):
    """The epochs of warmup the schedule really has."""
    return 0.0 if schedule.warmup == "none" else schedule.warmup_epochs


def learning_rate(progress, schedule, base_lr, peak_lr, epochs):
    """The LR at `progress` epochs into training (epoch + step / steps_per_epoch)."""
    warmup_epochs = warmup_length(schedule)
    if progress < warmup_epochs:
        if schedule.warmup == "constant":
            return base_lr
        return base_lr + (peak_lr - base_lr) * progress / warmup_epochs
    if schedule.decay == "constant":
        return peak_lr
    if schedule.decay == "step":
        return peak_lr * schedule.gamma ** math.floor(progress / schedule.step_epochs)
    if schedule.decay == "multistep":
        return peak_lr * schedule.gamma ** sum(progress >= milestone for milestone in schedule.milestones)
    remaining = (progress - warmup_epochs) / max(epochs - warmup_epochs, 1e-12)
    remaining = min(max(remaining, 0.0), 1.0)
    if schedule.decay == "cosine":
        shape = 0.5 * (1 + math.cos(math.pi * remaining))
    elif schedule.decay == "poly":
        shape = (1 - remaining) ** schedule.power
    else:
        raise ValueError(f"schedule.decay={schedule.decay!r} is not a known decay")
    return schedule.final_lr + (peak_lr - schedule.final_lr) * shape
