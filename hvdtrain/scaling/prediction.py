"""What a dry run predicts of a layout: each device's efficiency and the job's throughput, from
the scaling model (step_time.py), when the links and one device's throughput are known.

One device's throughput comes from a profile (`hvdtrain ... profile=true`, profile.py), saved
under runs/.profiles/ for the recipe, model, per-worker batch and device, else from the recipe's
published `recipe.reference_throughput`. The links between hosts are `cluster.network.gbps` and
`latency_us`; those within a host `within_gbps` and `within_latency_us`, by default the
device's usual link. The gradients are the PyTorch model's parameter tensors, last layer first,
whatever the framework trains (the Keras models are the same architectures).
"""

import functools
import json
import math
from pathlib import Path

from hvdtrain.run.config import ConfigError
from hvdtrain.run.config.cluster import NETWORK_STEP_LATENCY_US
from hvdtrain.run.config.model import ModelConfig
from hvdtrain.scaling import step_time

PROFILES_DIR = Path("runs") / ".profiles"  # beside the runs, in the directory `hvdtrain` starts in


def profile_path(cfg, device_kind):
    """Where the profile of this recipe, model, per-worker batch and device ("cpu" or "cuda") is
    kept; a forward pass in lower precision is a device of its own."""
    precision = cfg.train.autocast
    device = device_kind if precision == "none" else f"{device_kind}-{precision}"
    return PROFILES_DIR / f"{cfg.recipe.name}-{cfg.model.name}-{cfg.train.batch_size}-{device}.json"


def predict(cfg, planned_device):
    """The plan's keys of the prediction: `predicted_efficiency` and `predicted_samples_per_s`
    with `prediction_basis` (what they rest on, in one line), or nulls and `prediction_missing`
    (what is unknown and how to give it, in one line). `planned_device` is the plan's device;
    where it is "auto" (other hosts decide when the job starts), a profile of CUDA or else of the
    CPU says which, and the recipe's reference is taken for CUDA."""
    kinds = ("cuda", "cpu") if planned_device == "auto" else (planned_device,)
    device_kind = next((kind for kind in kinds if profile_path(cfg, kind).is_file()), kinds[0])
    hosts, slots = cfg.cluster.num_hosts, cfg.cluster.slots
    throughput, throughput_basis = _throughput(cfg, device_kind)
    network = cfg.cluster.network
    missing = [f"cluster.network.{key} (between hosts, e.g. cluster.network.{key}={example})"
               for key, example in (("gbps", 25), ("latency_us", NETWORK_STEP_LATENCY_US))
               if hosts > 1 and network[key] is None]
    if throughput is None:
        missing.append(throughput_basis)
    if missing:
        return {"predicted_efficiency": None, "predicted_samples_per_s": None,
                "prediction_missing": "unknown: " + "; ".join(missing)}
    links = _network(network, device_kind)
    workload = _workload(cfg, throughput)
    engine = {**_engine(cfg.recipe.framework), "hierarchical": step_time.HIERARCHICAL[device_kind]}
    used = [f"{link.gbps:g} Gbit/s and {link.latency_us:g} us a step {where}; "
            for link, where, ranks in ((links.across, "between hosts", hosts), (links.within, "within a host", slots))
            if ranks > 1]
    return {
        "predicted_efficiency": step_time.efficiency(workload, hosts, slots, links, **engine),
        "predicted_samples_per_s": step_time.samples_per_s(workload, hosts, slots, links, **engine),
        "prediction_basis": (
            f"{throughput_basis}; backward {workload.backward_fraction:.2f} of a step's compute; "
            f"{''.join(used)}fusion threshold {engine['fusion_threshold_bytes'] / 2**20:g} MiB, "
            f"cycle time {engine['cycle_time_s'] * 1e3:g} ms, "
            f"gradient segments {engine['segment_bytes'] / 2**20:g} MiB"
            f"{'; hierarchical across hosts, as Open MPI reduces CPU ranks' if engine['hierarchical'] else ''}"),
    }


def _throughput(cfg, device_kind):
    """(one device's {samples_per_s, backward_fraction, and from a profile gradient_bytes}, what
    they come from), or (None, why there is none and how to give one)."""
    path = profile_path(cfg, device_kind)
    if path.is_file():
        profile = json.loads(path.read_text())
        return profile, f"profile {path}: {profile['samples_per_s']:.4g} samples/s on {profile['device']}"
    reference = cfg.recipe.reference_throughput
    if reference is not None and (reference.model, reference.batch_size) == (cfg.model.name, cfg.train.batch_size):
        published = {"samples_per_s": reference.samples_per_s, "backward_fraction": step_time.DEFAULT_BACKWARD_FRACTION}
        return published, (f"recipe.reference_throughput: {reference.samples_per_s:g} samples/s on {reference.device} "
                           f"({reference.source})")
    other = "" if reference is None else (f" (recipe.reference_throughput is {reference.model}'s at batch "
                                          f"{reference.batch_size}, not {cfg.model.name}'s at {cfg.train.batch_size})")
    return None, (f"one device's throughput{other}: measure it on a {device_kind} device with profile=true in place "
                  f"of dry_run=true (it writes {path}), or set recipe.reference_throughput")


def _network(network, device_kind):
    usual = step_time.WITHIN_HOST[device_kind]
    within = step_time.Link(_given(network.within_gbps, usual.gbps), _given(network.within_latency_us, usual.latency_us))
    # On one host the link between hosts is never used, and may be unknown.
    across = step_time.Link(_given(network.gbps, math.nan), _given(network.latency_us, math.nan))
    return step_time.Network(across=across, within=within)


def _given(value, default):
    return default if value is None else value


def _workload(cfg, throughput):
    """One rank's step: train.backward_passes_per_step passes of train.batch_size, the gradients
    reduced during the last pass's backward only."""
    passes = cfg.train.backward_passes_per_step
    samples = cfg.train.batch_size * passes
    sizes = throughput.get("gradient_bytes") or gradient_bytes(cfg.model.name, cfg.model.num_classes)
    return step_time.Workload(samples_per_step=samples, compute_s=samples / throughput["samples_per_s"],
                            backward_fraction=throughput["backward_fraction"] / passes, gradient_bytes=tuple(sizes))


@functools.lru_cache(maxsize=None)
def gradient_bytes(model_name, num_classes):
    """gradient_sizes of the PyTorch model, built on torch's meta device (no memory, no init)."""
    import torch
    from omegaconf import OmegaConf

    from hvdtrain.tasks.models_torch import build_model

    with torch.device("meta"):
        return gradient_sizes(build_model(OmegaConf.structured(ModelConfig(name=model_name, num_classes=num_classes))))


def gradient_sizes(model):
    """The bytes of each parameter tensor's gradient of a torch model, last layer first: the
    order backward makes them in."""
    return tuple(p.numel() * p.element_size() for p in reversed(list(model.parameters())) if p.requires_grad)


def _engine(framework):
    """The engine's fusion threshold and cycle time and the optimizer's gradient segments, as the
    workers will read them (TensorFlow's tape submits each gradient on its own)."""
    from hvdtrain.core.settings import from_environment

    try:
        settings = from_environment()
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return {"fusion_threshold_bytes": settings.fusion_threshold_bytes, "cycle_time_s": settings.cycle_time_s,
            "segment_bytes": settings.segment_bytes if framework == "torch" else 0}

