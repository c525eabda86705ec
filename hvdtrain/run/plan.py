"""The plan of a run, derived once from its config and hosts: world size, global batch, the
linearly scaled LR (Goyal et al. 2017), warmup, steps per epoch and the device (devices.py).
`hvdtrain ... dry_run=true` prints it as JSON; every rank derives the same numbers from the same
functions once its data is loaded.
"""

import json
from dataclasses import asdict, dataclass, field
from typing import List, Optional

from hvdtrain.run.config import invalid
from hvdtrain.run.config.data import decoder, expected_train_size
from hvdtrain.run.config.schedule import warmup_length
from hvdtrain.run.devices import Device
from hvdtrain.run.hosts import Host
from hvdtrain.run.job import supervised


@dataclass(frozen=True)
class Plan:
    world_size: int
    hosts: List[Host]
    per_worker_batch_size: int
    backward_passes_per_step: int
    global_batch_size: int
    base_lr: float
    base_batch_size: int
    peak_lr: float
    warmup: str  # gradual, constant or none (schedule.warmup)
    warmup_epochs: float  # 0 where there is no warmup
    epochs: int
    steps_per_epoch: Optional[int]
    device: str  # cpu or cuda; auto where hosts other than this machine decide when the job starts
    gpus_per_host: Optional[int]  # on CUDA, one GPU per rank (the most ranks a host has); else null
    device_reason: str
    decode: Optional[str]  # an ImageFolder tree's decoder: cpu, gpu, or auto until the device is known; else null
    decode_reason: str
    restarts: int  # the most restarts after failures (fault.max_restarts); 0 in a job hvdtrain did not launch
    launch_command: List[str] = field(default_factory=list)

    def as_json(self):
        return asdict(self)


def make_plan(cfg, hosts, device: Device, launch_command=(), train_size=None):
    """The plan for `cfg` on `hosts`, training on `device` (devices.planned before launch,
    devices.agreed in the job). `train_size` is the number of training samples when the data is
    loaded; before that, the data config's expected size (or unknown)."""
    world_size = sum(host.slots for host in hosts)
    samples_per_step = cfg.train.batch_size * cfg.train.backward_passes_per_step
    global_batch = world_size * samples_per_step
    size_key = "data.train_size"
    if train_size is None:
        train_size, size_key = expected_train_size(cfg.data)
    steps = None if train_size is None else steps_per_epoch(train_size, world_size, samples_per_step)
    if steps == 0:
        given = cfg.data.num_samples if size_key == "data.num_samples" else train_size
        raise invalid(
            f"{size_key}={given}: {train_size} training samples, fewer than one global batch ({global_batch} = "
            f"{world_size} ranks x train.batch_size={cfg.train.batch_size} x "
            f"train.backward_passes_per_step={cfg.train.backward_passes_per_step})")
    decode, decode_reason = decoder(cfg.data, cfg.recipe.framework, device.kind)
    if decode == "gpu" and device.kind == "cpu":
        raise invalid(f"data.decode=gpu: the ranks train on the CPU ({device.reason}); use data.decode=auto or cpu")
    return Plan(
        world_size=world_size,
        hosts=list(hosts),
        per_worker_batch_size=cfg.train.batch_size,
        backward_passes_per_step=cfg.train.backward_passes_per_step,
        global_batch_size=global_batch,
        base_lr=cfg.optimizer.base_lr,
        base_batch_size=cfg.optimizer.base_batch_size,
        peak_lr=cfg.optimizer.base_lr * global_batch / cfg.optimizer.base_batch_size,
        warmup=cfg.schedule.warmup,
        warmup_epochs=warmup_length(cfg.schedule),
        epochs=cfg.train.epochs,
        steps_per_epoch=steps,
        device=device.kind,
        gpus_per_host=max(host.slots for host in hosts) if device.kind == "cuda" else None,
        device_reason=device.reason,
        decode=decode,
        decode_reason=decode_reason,
        restarts=cfg.fault.max_restarts if supervised() else 0,
        launch_command=list(launch_command),
    )


def steps_per_epoch(train_size, world_size, samples_per_step):
    """Optimizer steps per epoch. Every rank takes the same whole number of samples
    (hvdtrain/training/sharding.py) and only full global batches are trained, as with drop_last."""
    return (train_size // world_size) // samples_per_step


def warmup_text(plan):
    if not plan.warmup_epochs:
        return "no warmup"
    return f"{plan.warmup} warmup {plan.warmup_epochs:g} epochs"


def restarts_text(plan):
    if supervised():
        return f"up to {plan.restarts} (fault.max_restarts), each from the newest checkpoint"
    return "none: mpirun or srun started this job, and only they could start it again"


def summary(plan, cfg, run_dir):
    """The one-screen overview printed when a run starts."""
    hosts = ", ".join(f"{h.host}:{h.slots}" for h in plan.hosts)
    target = cfg.recipe.target
    steps = "unknown until the data is loaded" if plan.steps_per_epoch is None else plan.steps_per_epoch
    decay = cfg.schedule.decay + (f" at epochs {list(cfg.schedule.milestones)}" if cfg.schedule.decay == "multistep" else "")
    lines = [
        f"hvdtrain: recipe {cfg.recipe.name} ({cfg.recipe.framework}) -- {cfg.recipe.description}".rstrip(" -"),
        f"  model        {cfg.model.name}, {cfg.model.num_classes} classes",
        f"  data         {cfg.data.source}" + (f" at {cfg.data.root}" if cfg.data.root else ""),
        f"  cluster      {cfg.cluster.name}: {plan.world_size} ranks on {hosts}",
        f"  device       {plan.device} ({plan.device_reason})",
        *([f"  decode       {plan.decode} ({plan.decode_reason})"] if plan.decode else []),
        f"  batch        {plan.per_worker_batch_size} per worker x {plan.backward_passes_per_step} backward passes"
        f" x {plan.world_size} ranks = {plan.global_batch_size} per step",
        f"  LR           {plan.base_lr:g} per {plan.base_batch_size} samples -> peak {plan.peak_lr:g}"
        f" (linear scaling), {warmup_text(plan)}, then {decay}",
        f"  training     {plan.epochs} epochs x {steps} steps",
        f"  restarts     {restarts_text(plan)}",
        "  target       " + (f"{target.metric} {target.value:g} ({target.source})" if target else "none"),
        f"  run dir      {run_dir}",
    ]
    return "\n".join(lines)


def printed(plan_json):
    """A plan as a dry run prints it: indented JSON, which a 128-host plan needs to be readable."""
    return json.dumps(plan_json, indent=2)


def read_plans(text):
    """The plans that dry runs printed into `text` (one, or one per job of a sweep), whatever
    other lines surround them."""
    lines, plans, start = text.splitlines(), [], None
    for number, line in enumerate(lines):
        if line == "{":
            start = number
        elif line == "}" and start is not None:
            plans.append(json.loads("\n".join(lines[start:number + 1])))
            start = None
    return plans
