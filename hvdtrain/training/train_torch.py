"""Data-parallel training with PyTorch on `hvdtrain.torch`, written as a Horovod user writes it.

Every rank runs `train(cfg, run_dir)`: init -> build the task (model, sharded data) and the
DistributedOptimizer -> the shared loop (loop.py: start or resume, epochs of steps, checkpoints,
evaluation, progress) with PyTorch's part of each: a training step, sharded evaluation with
exactly reduced sums, the state of a checkpoint. Everything that is not PyTorch (plan, sharding,
LR schedule, checkpoint files, progress, logs, report) lives in framework-neutral modules, which
the sibling loop train_tensorflow.py uses as well.
"""

import io
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import hvdtrain.torch as hvd
from hvdtrain.training import loop, sharding
from hvdtrain.runner.cluster import job_hosts
from hvdtrain.runner.plan import make_plan
from hvdtrain.tasks.data_torch import build_datasets
from hvdtrain.tasks.models_torch import build_model


def train(cfg, run_dir):
    session_start = time.time()
    hvd.init()
    device = _device(cfg.train.device)
    torch.manual_seed(cfg.train.seed)
    train_set, val_set = build_datasets(cfg.data, cfg.model.num_classes, cfg.train.seed)
    plan = make_plan(cfg, job_hosts(), train_size=len(train_set))
    passes = cfg.train.backward_passes_per_step

    model = build_model(cfg.model).to(device)
    optimizer = torch.optim.SGD(_parameter_groups(model, cfg.optimizer), lr=plan.base_lr,
                                momentum=cfg.optimizer.momentum, nesterov=cfg.optimizer.nesterov,
                                weight_decay=cfg.optimizer.weight_decay)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes, op=hvd.Average)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.autocast and device.type == "cuda")

    def restore(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])

    def step(batches, lr, global_step):
        _set_learning_rate(optimizer, lr, cfg.optimizer.momentum_correction)
        torch.manual_seed(sharding.step_seed(cfg.train.seed, hvd.rank(), global_step))
        return _train_step(model, optimizer, scaler, batches, passes, device, cfg.train.autocast)

    loop.run(cfg, plan, run_dir, session_start, len(train_set),
             decode=_decode, restore=restore,
             broadcast_initial=lambda: hvd.broadcast_parameters(model.state_dict(), root_rank=0),
             epoch_batches=lambda epoch, indices: iter(_loader(train_set, indices, cfg, epoch, device)),
             train_step=step,
             evaluate=(lambda: evaluate(model, val_set, cfg, device)) if len(val_set) else None,
             checkpoint_state=lambda: _checkpoint_state(model, optimizer, scaler))


def _train_step(model, optimizer, scaler, batches, passes, device, autocast):
    """One optimizer step: `passes` backward passes, gradients averaged over the ranks, one update.
    synchronize / skip_synchronize is Horovod's way to let GradScaler unscale the averaged
    gradients before the update; without autocast on a GPU the scaler does nothing."""
    optimizer.zero_grad()
    total = 0.0
    for _ in range(passes):
        inputs, labels = next(batches)
        with torch.autocast(device.type, dtype=_autocast_dtype(device), enabled=autocast):
            loss = F.cross_entropy(model(inputs.to(device)), labels.to(device))
        scaler.scale(loss / passes).backward()
        total += loss.item()
    optimizer.synchronize()
    scaler.unscale_(optimizer)
    with optimizer.skip_synchronize():
        scaler.step(optimizer)
    scaler.update()
    return total / passes


@torch.no_grad()
def evaluate(model, val_set, cfg, device):
    """Validation metrics over the whole validation set: each rank evaluates its shard and the
    sums (loss, correct top-1, correct top-5, samples) are added up across ranks, exactly."""
    _average_buffers(model)
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64)
    indices = sharding.eval_shard(len(val_set), hvd.rank(), hvd.size())
    for inputs, labels in _loader(val_set, indices, cfg, None, device):
        with torch.autocast(device.type, dtype=_autocast_dtype(device), enabled=cfg.train.autocast):
            logits = model(inputs.to(device)).float()
        labels = labels.to(device)
        ranked = logits.topk(min(5, logits.shape[1]), dim=1).indices == labels[:, None]
        totals += torch.tensor([F.cross_entropy(logits, labels, reduction="sum").item(),
                                ranked[:, 0].sum().item(), ranked.any(dim=1).sum().item(), len(labels)],
                               dtype=torch.float64)
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
    return torch.load(io.BytesIO(data), weights_only=True)


def _parameter_groups(model, optimizer_cfg):
    """Weight decay on every parameter except, as the recipe asks, BatchNorm's gamma and beta
    ("bn") and the biases of other layers ("bias")."""
    excluded = set(optimizer_cfg.exclude_from_weight_decay)
    batch_norm = {id(p) for module in model.modules() if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
                  for p in module.parameters(recurse=False)}
    decayed, not_decayed = [], []
    for name, p in model.named_parameters():
        kind = "bn" if id(p) in batch_norm else "bias" if name.endswith("bias") else "weight"
        (not_decayed if kind in excluded else decayed).append(p)
    groups = [{"params": decayed}, {"params": not_decayed, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def _set_learning_rate(optimizer, lr, momentum_correction):
    """PyTorch's SGD keeps the LR out of the momentum buffer (v <- m v + g; w <- w - lr v), which is
    Goyal et al.'s momentum correction built in. Without the correction the buffer behaves as in
    the form v <- m v + lr g, which after an LR change still carries the old LR: rescale it so."""
    for group in optimizer.param_groups:
        if not momentum_correction and group["lr"] != lr:
            for p in group["params"]:
                buffer = optimizer.state.get(p, {}).get("momentum_buffer")
                if buffer is not None:
                    buffer.mul_(group["lr"] / lr)
        group["lr"] = lr


def _loader(dataset, indices, cfg, epoch, device):
    """Batches of `indices`; for training (`epoch` given) each sample carries its augmentation seed."""
    keys = [(int(i), 0 if epoch is None else sharding.sample_seed(cfg.train.seed, epoch, i)) for i in indices]
    batches = [keys[i:i + cfg.train.batch_size] for i in range(0, len(keys), cfg.train.batch_size)]
    return DataLoader(dataset, batch_sampler=batches, num_workers=cfg.data.loader_workers,
                      pin_memory=device.type == "cuda")


def _device(choice):
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(hvd.local_rank())
        return torch.device("cuda", hvd.local_rank())
    return torch.device("cpu")


def _autocast_dtype(device):
    return torch.float16 if device.type == "cuda" else torch.bfloat16
