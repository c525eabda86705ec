"""`hvdtrain ... profile=true`: one device's training step, measured for the plan's prediction.

A few steps of the recipe's model at its per-worker batch, on random inputs of the data's shape
(the input pipeline is not what is measured), with PyTorch, on one device: the GPU where
train.device asks for CUDA or (auto) where torch sees one, else the CPU with the cores one of
the layout's ranks would get. Each step is timed in three parts, the device synchronised
between them: forward, backward (the window the allreduce can hide in), update. The figures go
to runs/.profiles/ (prediction.profile_path), where a dry run of the same recipe, model, batch
and device finds them.
"""

import json
import time

from hvdtrain.run import devices
from hvdtrain.run.config import invalid
from hvdtrain.run.hosts import threads_per_rank
from hvdtrain.run.config.model import MODELS
from hvdtrain.run.run_dir import write_atomically
from hvdtrain.scaling import prediction
from hvdtrain.tasks.data import MNIST1D_LENGTH

WARMUP_STEPS = 3  # the first steps allocate memory and choose kernels
TIMED_STEPS = 5
DIGITS_SIDE = 8  # scikit-learn's digits are 8x8


def profile(cfg):
    import torch

    from hvdtrain.tasks.models_torch import build_model
    from hvdtrain.training.train_torch import build_optimizer

    device, name = _device(cfg, torch)
    model = build_model(cfg.model).to(device)
    if cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(model, cfg.optimizer, cfg.optimizer.base_lr)
    inputs = torch.randn((cfg.train.batch_size, *_sample_shape(cfg)), device=device)
    if cfg.train.channels_last:
        inputs = inputs.to(memory_format=torch.channels_last)
    labels = torch.randint(cfg.model.num_classes, (cfg.train.batch_size,), device=device)
    precision = cfg.train.autocast

    for _ in range(WARMUP_STEPS):
        timed_step(model, optimizer, inputs, labels, precision)
    forward_s, backward_s, update_s = map(sum, zip(*(timed_step(model, optimizer, inputs, labels, precision)
                                                       for _ in range(TIMED_STEPS))))
    step_s = forward_s + backward_s + update_s
    measured = {
        "recipe": cfg.recipe.name, "model": cfg.model.name, "batch_size": cfg.train.batch_size,
        "precision": precision, "device": name, "steps": TIMED_STEPS,
        "compute_s": step_s / TIMED_STEPS,
        "samples_per_s": cfg.train.batch_size * TIMED_STEPS / step_s,
        "backward_fraction": backward_s / step_s,
        "gradient_bytes": prediction.gradient_sizes(model),
    }
    path = prediction.profile_path(cfg, device.type)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(measured, indent=1).encode())
    print(f"hvdtrain: profile of {cfg.model.name} at {cfg.train.batch_size} per step on {name}: "
          f"{measured['samples_per_s']:.4g} samples/s, {measured['compute_s'] * 1e3:.4g} ms a step, "
          f"backward {measured['backward_fraction']:.2f} of it; written to {path}", flush=True)


def timed_step(model, optimizer, inputs, labels, precision="none"):
    """One training step (cross-entropy), timed in its three parts: (forward, backward, update)
    seconds. On CUDA the device is synchronised at each boundary, so that each part is the
    device's time and not its launches'."""
    import torch
    import torch.nn.functional as F

    from hvdtrain.training.train_torch import autocast_context

    def clock():
        if inputs.device.type == "cuda":
            torch.cuda.synchronize(inputs.device)
        return time.perf_counter()

    started = clock()
    optimizer.zero_grad()
    with autocast_context(inputs.device, precision):
        loss = F.cross_entropy(model(inputs), labels)
    forward_done = clock()
    loss.backward()
    backward_done = clock()
    optimizer.step()  # a DistributedOptimizer waits here for what backward did not hide of the allreduce
    return forward_done - started, backward_done - forward_done, clock() - backward_done


def _device(cfg, torch):
    """(the torch.device to measure on, its name for the profile)."""
    requested = cfg.train.device
    if requested == "cuda" and not torch.cuda.is_available():
        raise invalid("train.device='cuda': profile=true finds no CUDA device on this machine; "
                      "use train.device=cpu or auto")
    if requested != "cpu" and torch.cuda.is_available():
        torch.backends.cudnn.benchmark = cfg.train.cudnn_benchmark
        return torch.device("cuda", 0), torch.cuda.get_device_name(0)
    devices.check_autocast(cfg, devices.Device("cpu", "profile=true measures the CPU: torch sees no CUDA device"))
    # A rank of the layout gets this share of a host's cores, as the launcher gives it.
    threads = threads_per_rank(cfg.cluster.slots)
    torch.set_num_threads(threads)
    return torch.device("cpu"), f"CPU, {threads} thread{'s' if threads > 1 else ''}"


def _sample_shape(cfg):
    """The shape of one input the model takes (as data_torch gives it)."""
    kind = MODELS[cfg.model.name]
    if kind == "image":
        return 3, cfg.data.image_size, cfg.data.image_size
    if kind == "digits":
        return 1, DIGITS_SIDE, DIGITS_SIDE
    return 1, MNIST1D_LENGTH
