"""The `train` section: the length of training, the batch, where and in which precision each rank
computes, and how often a run logs, evaluates and checkpoints."""

from dataclasses import dataclass
from typing import Optional

from hvdtrain.run.config.model import MODELS, image_models

DEVICES = ("auto", "cpu", "cuda")  # hvdtrain/run/devices.py decides what auto comes to
AUTOCAST_MODES = ("none", "bf16", "fp16")
PREEMPT_SIGNALS = ("USR1", "USR2", "TERM")  # train.preempt_signal, by its name without SIG


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
    autocast: str = "none"
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


def check(cfg, problems):
    train = cfg.train
    problems.check(train.epochs >= 1, "train.epochs", "must be at least 1")
    problems.check(train.batch_size >= 1, "train.batch_size", "must be a positive number of samples per worker")
    problems.check(train.backward_passes_per_step >= 1, "train.backward_passes_per_step", "must be at least 1")
    problems.check(train.device in DEVICES, "train.device", f"allowed: {', '.join(DEVICES)}")
    problems.check(train.autocast in AUTOCAST_MODES, "train.autocast", f"allowed: {', '.join(AUTOCAST_MODES)}")
    if train.autocast == "fp16":
        problems.check(cfg.recipe.framework != "tensorflow", "train.autocast",
                       "the tensorflow loop has no loss scaling; use bf16 (Keras's mixed_bfloat16 policy)")
        problems.check(train.device != "cpu", "train.autocast",
                       "float16 autocast is for CUDA, with a GradScaler; on the CPU (train.device=cpu) use bf16")
    problems.check(not train.channels_last or MODELS.get(cfg.model.name) == "image", "train.channels_last",
                   f"applies to image models ({', '.join(image_models())}), not {cfg.model.name}")
    problems.check(train.log_every_steps >= 1, "train.log_every_steps", "must be at least 1")
    problems.check(train.eval_every_epochs >= 1, "train.eval_every_epochs", "must be at least 1")
    problems.check(train.checkpoint_every_steps >= 0, "train.checkpoint_every_steps",
                   "must be 0 (epoch ends only) or more")
    problems.check(train.keep_checkpoints >= 1, "train.keep_checkpoints", "must keep at least 1")
    problems.check(train.checkpoint_every_s >= 0, "train.checkpoint_every_s", "must be 0 (off) or a number of seconds")
    problems.check(train.preempt_signal is None or train.preempt_signal in PREEMPT_SIGNALS, "train.preempt_signal",
                   f"allowed: {', '.join(PREEMPT_SIGNALS)} (a signal's name without SIG), or null")
