"""Data-parallel training with PyTorch on `hvdtrain.torch`, written as a Horovod user writes it.

Every rank runs `train(cfg, run_dir, device)`: init -> build the task (model, sharded data) and
the DistributedOptimizer -> the shared loop (loop.py: start or resume, epochs of steps,
checkpoints, evaluation, progress) with PyTorch's part of each: a training step, sharded
evaluation with exactly reduced sums, the state of a checkpoint. Everything that is not PyTorch
(plan, sharding, LR schedule, checkpoint files, progress, logs, report) lives in
framework-neutral modules, which the sibling loop train_tensorflow.py uses as well. On CUDA the
input pipeline keeps its loader workers, pins its batches and copies them without blocking, and
no step waits for the GPU to read its loss.
"""

import contextlib
import io
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import hvdtrain.torch as hvd
from hvdtrain.training import loop, sharding
from hvdtrain.training.lars import LARS
from hvdtrain.run.hosts import job_hosts
from hvdtrain.run.plan import make_plan
from hvdtrain.run.config import ConfigError
from hvdtrain.run.config.data import decoder
from hvdtrain.tasks.data_torch import build_datasets, collate_function, rank_inputs
from hvdtrain.tasks.models_torch import build_model


def train(cfg, run_dir, device):
    """`device`: the run.devices.Device every rank agreed on (cpu, or cuda: the GPU of the local rank)."""
    session_start = time.time()
    hvd.init()
    target = _use_device(device.kind, cfg.train.cudnn_benchmark)
    precision = cfg.train.autocast
    torch.manual_seed(cfg.train.seed)
    train_set, val_set = build_datasets(cfg.data, cfg.model.num_classes, cfg.train.seed, _decoder(cfg.data, target))
    plan = make_plan(cfg, job_hosts(), device, train_size=len(train_set))
    passes = cfg.train.backward_passes_per_step
    to_device = ToDevice(target, cfg.train.channels_last)

    model = build_model(cfg.model).to(target)
    if cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = hvd.DistributedOptimizer(build_optimizer(model, cfg.optimizer, plan.base_lr),
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes, op=hvd.Average)
    scaler = torch.amp.GradScaler(target.type, enabled=precision == "fp16")  # fp16 is CUDA's only (run/devices.py)
    train_batches = EpochBatches(cfg.train.batch_size)
    train_loader = _loader(train_set, train_batches, cfg.data.loader_workers, target)
    layout = (_input_dtype(target, precision), torch.channels_last if cfg.train.channels_last else torch.contiguous_format)
    train_inputs, val_inputs = rank_inputs(train_set, target, *layout), rank_inputs(val_set, target, *layout)

    def restore(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])  # puts its state on the parameters' device
        if state["scaler"]:  # empty where the scaler was off (no fp16 there): this one starts afresh
            scaler.load_state_dict(state["scaler"])

    def epoch_batches(epoch, indices):
        train_batches.take([(int(i), sharding.sample_seed(cfg.train.seed, epoch, i)) for i in indices])
        return train_inputs.batches(train_loader)

    def input_counts():
        counts = train_inputs.counts()
        if counts is None:
            return None
        totals = hvd.allreduce(torch.tensor(list(counts.values())), op=hvd.Sum, name="inputs.counts")
        return dict(zip(counts, totals.tolist()))

    def step(batches, lr, global_step):
        _set_learning_rate(optimizer, lr, cfg.optimizer.momentum_correction)
        torch.manual_seed(sharding.step_seed(cfg.train.seed, hvd.rank(), global_step))
        return _train_step(model, optimizer, scaler, batches, passes, to_device, precision)

    loop.run(cfg, plan, run_dir, session_start, len(train_set),
             decode=_decode, restore=restore,
             broadcast_initial=lambda: hvd.broadcast_parameters(model.state_dict(), root_rank=0),
             epoch_batches=epoch_batches, train_step=step,
             evaluate=(lambda: evaluate(model, val_set, val_inputs, cfg, to_device, precision)) if len(val_set) else None,
             checkpoint_state=lambda: _checkpoint_state(model, optimizer, scaler), input_counts=input_counts)


class ToDevice:
    """Moves batches to the training device: asynchronously from pinned memory on CUDA, and
    images (4-D) into channels_last where the model is."""

    def __init__(self, device, channels_last):
        self.device = device
        self.channels_last = channels_last

    def __call__(self, tensor):
        if self.channels_last and tensor.dim() == 4:
            return tensor.to(self.device, non_blocking=True, memory_format=torch.channels_last)
        return tensor.to(self.device, non_blocking=True)


class EpochBatches:
    """A loader's batch sampler: batches of the sample keys (index, augmentation seed) given last.
    The training loader serves every epoch from one of these, so that its worker processes
    persist: it asks for the batches, in the training process, each time an epoch begins."""

    def __init__(self, batch_size, keys=()):
        self.batch_size = batch_size
        self.keys = list(keys)

    def take(self, keys):
        self.keys = keys

    def __iter__(self):
        return (self.keys[i:i + self.batch_size] for i in range(0, len(self.keys), self.batch_size))


def _train_step(model, optimizer, scaler, batches, passes, to_device, precision):
    """One optimizer step: `passes` backward passes, gradients averaged over the ranks, one update.
    synchronize / skip_synchronize is Horovod's way to let GradScaler unscale the averaged
    gradients before the update; without fp16 the scaler does nothing. Returns this rank's mean
    loss as a tensor on the device: reading it would wait for the device, which the progress
    report does only when it records (train.log_every_steps)."""
    optimizer.zero_grad()
    total = 0.0
    for _ in range(passes):
        images, labels = next(batches)
        with autocast_context(to_device.device, precision):
            loss = F.cross_entropy(model(to_device(images)), to_device(labels))
        scaler.scale(loss / passes).backward()
        total = total + loss.detach().float()
    optimizer.synchronize()
    scaler.unscale_(optimizer)
    with optimizer.skip_synchronize():
        scaler.step(optimizer)
    scaler.update()
    return total / passes


@torch.no_grad()
def evaluate(model, val_set, val_inputs, cfg, to_device, precision):
    """Validation metrics over the whole validation set: each rank evaluates its shard and the
    sums (loss, correct top-1, correct top-5, samples) are added up across ranks, exactly. The
    sums stay on the device until the shard is done."""
    _average_buffers(model)
    model.eval()
    sums, count = torch.zeros(3, dtype=torch.float64, device=to_device.device), 0
    batches = EpochBatches(cfg.train.batch_size,
                           [(int(i), 0) for i in sharding.eval_shard(len(val_set), hvd.rank(), hvd.size())])
    for images, labels in val_inputs.batches(_loader(val_set, batches, cfg.data.loader_workers, to_device.device,
                                                     persistent=False)):
        with autocast_context(to_device.device, precision):
            logits = model(to_device(images)).float()
        labels = to_device(labels)
        ranked = logits.topk(min(5, logits.shape[1]), dim=1).indices == labels[:, None]
        sums += torch.stack([F.cross_entropy(logits, labels, reduction="sum").double(),
                             ranked[:, 0].sum().double(), ranked.any(dim=1).sum().double()])
        count += len(labels)
    totals = torch.cat([sums.cpu(), torch.tensor([count], dtype=torch.float64)])
    loss, top1, top5, count = hvd.allreduce(totals, op=hvd.Sum, name="eval.totals").tolist()
    model.train()
    return {"val_loss": loss / count, "val_top1": 100.0 * top1 / count, "val_top5": 100.0 * top5 / count}


def _average_buffers(model):
    """Average BatchNorm's running statistics over the ranks (each saw different data), so that
    every shard is evaluated, and every checkpoint saved, with one and the same model."""
    handles = [hvd.allreduce_async_(buffer, op=hvd.Average, name=f"buffer.{name}")
               for name, buffer in model.named_buffers() if buffer.is_floating_point()]
    for handle in handles:
        hvd.synchronize(handle)


def _checkpoint_state(model, optimizer, scaler):
    """The bytes of a checkpoint's PyTorch state, on rank 0."""
    _average_buffers(model)
    if hvd.rank() != 0:
        return None
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()},
               buffer)
    return buffer.getvalue()


def _decode(data):
    """A checkpoint's PyTorch state, its tensors on the CPU wherever they were saved (a GPU's
    checkpoint reads on a machine without one). Rank 0 decodes it and broadcasts it as an object,
    so it must not hold tensors of one GPU; restore() copies them to the device of the model."""
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def build_optimizer(model, optimizer_cfg, lr):
    """The optimizer.name of the recipe: torch's SGD, or LARS (lars.py) on top of the same momentum
    SGD, over the model's parameter groups."""
    options = dict(lr=lr, momentum=optimizer_cfg.momentum, nesterov=optimizer_cfg.nesterov,
                   weight_decay=optimizer_cfg.weight_decay)
    groups = _parameter_groups(model, optimizer_cfg)
    if optimizer_cfg.name == "lars":
        return LARS(groups, trust_coefficient=optimizer_cfg.trust_coefficient, **options)
    return torch.optim.SGD(groups, **options)


def _parameter_groups(model, optimizer_cfg):
    """The parameters grouped by what the recipe excludes them from: weight decay
    (optimizer.exclude_from_weight_decay) and LARS's layer-wise adaptation
    (optimizer.exclude_from_adaptation), each a list of kinds: BatchNorm's gamma and beta ("bn"),
    the biases of other layers ("bias")."""
    no_decay, no_adaptation = set(optimizer_cfg.exclude_from_weight_decay), set(optimizer_cfg.exclude_from_adaptation)
    batch_norm = {id(p) for module in model.modules() if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
                  for p in module.parameters(recurse=False)}
    groups = {}
    for name, p in model.named_parameters():
        kind = "bn" if id(p) in batch_norm else "bias" if name.endswith("bias") else "weight"
        exclusions = {}
        if kind in no_decay:
            exclusions["weight_decay"] = 0.0
        if kind in no_adaptation:
            exclusions["layer_adaptation"] = False
        groups.setdefault(tuple(exclusions.items()), []).append(p)
    return [{"params": params, **dict(exclusions)} for exclusions, params in groups.items()]


def _set_learning_rate(optimizer, lr, momentum_correction):
    """PyTorch's SGD, and LARS as lars.py writes it, keep the LR out of the momentum buffer
    (v <- m v + g; w <- w - lr v), which is Goyal et al.'s momentum correction built in. Without the
    correction the buffer behaves as in the form v <- m v + lr g, which after an LR change still
    carries the old LR: rescale it so."""
    for group in optimizer.param_groups:
        if not momentum_correction and group["lr"] != lr:
            for p in group["params"]:
                buffer = optimizer.state.get(p, {}).get("momentum_buffer")
                if buffer is not None:
                    buffer.mul_(group["lr"] / lr)
        group["lr"] = lr


def _loader(dataset, batch_sampler, workers, device, persistent=True):
    """Batches from `batch_sampler` (an EpochBatches). On CUDA they come in pinned memory, from
    which ToDevice copies them without blocking."""
    return DataLoader(dataset, batch_sampler=batch_sampler, num_workers=workers, collate_fn=collate_function(dataset),
                      persistent_workers=persistent and workers > 0, pin_memory=device.type == "cuda")


def _decoder(data_cfg, target):
    """Where this rank decodes an ImageFolder tree's JPEGs (data.decode as the plan resolves it for
    its device): "gpu" only where torchvision's decoder runs on it, which auto checks, else "cpu"."""
    decode, _ = decoder(data_cfg, "torch", target.type)
    if decode != "gpu":
        return decode
    from hvdtrain.tasks.image_folder_torch import device_decodes

    if target.type == "cuda" and device_decodes(target):
        return "gpu"
    if data_cfg.decode == "gpu":
        why = "the rank trains on the CPU" if target.type != "cuda" else \
            f"torchvision's JPEG decoder does not run on {target} here"
        raise ConfigError(f"data.decode=gpu: {why}; use data.decode=auto or cpu (PIL in the loader workers)")
    if hvd.rank() == 0:
        print("hvdtrain: data.decode=auto: torchvision's JPEG decoder does not run on this GPU; the loader "
              "workers decode with PIL", flush=True)
    return "cpu"


def _input_dtype(target, precision):
    """The dtype of the images a device decoder hands the model: autocast's, which the first layer
    would cast them to anyway."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32) if target.type == "cuda" \
        else torch.float32


def _use_device(kind, cudnn_benchmark):
    """The torch.device of this rank: the CPU, or the GPU of its local rank among those it sees
    (one GPU per rank; run/devices.py)."""
    if kind == "cpu":
        return torch.device("cpu")
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = cudnn_benchmark
    return device


def autocast_context(device, precision):
    """The forward pass's precision: "none", "bf16" or "fp16" (train.autocast)."""
    if precision == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
