"""Which device a run trains on: `train.device` (auto | cpu | cuda) against the GPUs each host
shows, one GPU per local rank, as with Horovod (a rank takes the GPU of its local rank, counted
among those it sees: where a scheduler shows each rank a GPU of its own, as Slurm's
--gpus-per-task does through CUDA_VISIBLE_DEVICES, that one).

- cpu: the CPU, wherever the ranks run.
- cuda: every host needs at least as many CUDA devices as it has ranks; else the run is refused
  with the numbers: before launch when all ranks run on this machine, and otherwise by the ranks
  themselves when the job starts (a login node that launches onto GPU nodes cannot see them),
  in one line on every rank rather than a traceback.
- auto: CUDA when every host has a GPU for each of its ranks, else the CPU for all ranks (a job
  that trained partly on GPUs and partly on CPUs would run at the pace of its CPUs), saying why.
  So the default recipe's 2 local ranks train on the CPU of a machine with one GPU, and on the
  GPUs of a machine with two.
The same rule decides before launch (the plan, `dry_run`) and in the job (`agreed`), so that the
plan says what the ranks will do. fp16 autocast needs CUDA, which only the chosen device shows.
"""

import ctypes
import os
import socket
from dataclasses import dataclass

from hvdtrain.run.config import ConfigError, invalid
from hvdtrain.run.hosts import all_on_this_machine

VISIBLE_DEVICES_VARIABLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "cuda"; in a plan made before launch also "auto": the hosts decide at start
    reason: str  # one line: why this kind, for the plan and its summary


CPU = Device("cpu", "train.device=cpu")


def visible_gpus(framework):
    """How many CUDA devices `framework` sees on this machine. Asked of the framework itself: it is
    what the ranks will use, and tensorflow-cpu sees no GPU even where torch sees one. Without
    the CUDA driver no framework sees one, and that is known without the framework's import
    (2 s for torch, 5 s for TensorFlow), which the `hvdtrain` command would otherwise pay on every
    CPU machine."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    if framework == "tensorflow":
        from hvdtrain.run.tensorflow_startup import import_tensorflow

        return len(import_tensorflow().config.list_physical_devices("GPU"))
    import torch

    return torch.cuda.device_count()


def choose(requested, ranks, gpus, framework, where, visible_devices=None):
    """The Device for `ranks` ranks on a host (`where`: "this machine", "host NAME") that shows
    `gpus` CUDA devices to `framework`; ConfigError where train.device=cuda cannot have one GPU per
    rank there. `visible_devices`: that host's CUDA_VISIBLE_DEVICES, named in the refusal."""
    if requested == "cpu":
        return CPU
    shown = f"{framework} sees {_count(gpus, 'CUDA device')} for {_count(ranks, 'rank')} on {where}"
    if gpus >= ranks:
        return Device("cuda", f"train.device={requested}: one GPU per rank; {shown}")
    if requested == "auto":
        if gpus == 0:
            return Device("cpu", f"train.device=auto: {framework} sees no CUDA device on {where}")
        return Device("cpu", f"train.device=auto: {shown}, and each rank needs a GPU of its own; "
                             f"cluster.slots={gpus} would train on CUDA")
    limited = "" if visible_devices is None else f" with {VISIBLE_DEVICES_VARIABLE}={visible_devices!r}"
    if gpus == 0:
        raise invalid(f"train.device='cuda': no CUDA device visible to {framework} on {where}{limited}; "
                      f"use train.device=auto (a GPU where there is one) or train.device=cpu")
    raise invalid(f"cluster.slots={ranks}: {ranks} ranks on {where} but {framework} sees {_count(gpus, 'CUDA device')}"
                  f"{limited}; train.device=cuda takes one GPU per rank: set cluster.slots={gpus} or fewer, "
                  f"or train.device=cpu")


def check_autocast(cfg, device):
    """Refuse fp16 autocast where the run trains on the CPU (it needs CUDA; see TrainConfig.autocast)."""
    if device.kind == "cpu" and cfg.train.autocast == "fp16":
        raise invalid(f"train.autocast='fp16': float16 autocast is for CUDA, with a GradScaler, and this run "
                      f"trains on the CPU ({device.reason}); use train.autocast=bf16 on the CPU")


def planned(cfg, hosts, dry_run=False):
    """The Device of a run on `hosts`, decided before launch: on this machine's GPUs when all ranks
    run here; for other hosts, what train.device asks (they decide at start). ConfigError for a
    run that cannot train here, except in a dry run, whose plan can be made anywhere and says
    what launching it here would meet."""
    requested = cfg.train.device
    if requested != "cpu" and not all_on_this_machine(hosts):
        if requested == "cuda":
            return Device("cuda", "train.device=cuda: one GPU per rank, checked by each host when the job starts")
        return Device("auto", "train.device=auto: decided when the job starts: CUDA if every host has a GPU "
                              "for each of its ranks, else the CPU")
    try:
        gpus = 0 if requested == "cpu" else visible_gpus(cfg.recipe.framework)
        device = choose(requested, sum(host.slots for host in hosts), gpus, cfg.recipe.framework, "this machine",
                        os.environ.get(VISIBLE_DEVICES_VARIABLE))
        check_autocast(cfg, device)
    except ConfigError as refusal:
        if not dry_run:
            raise
        return Device(requested, f"launching it here is refused: {str(refusal).removeprefix('invalid config: ')}")
    return device


def agreed(cfg):
    """On every rank of a job: the Device all its ranks train on, from what each host shows. A
    refusal is raised on every rank alike (they decide from the same gathered numbers)."""
    from hvdtrain import core

    if cfg.train.device == "cpu":
        return CPU
    framework = cfg.recipe.framework
    gpus = visible_gpus(framework)
    taken = gpu_bus_id(core.local_rank() % gpus) if gpus else None
    mine = (socket.gethostname(), core.local_size(), gpus, os.environ.get(VISIBLE_DEVICES_VARIABLE), taken)
    hosts = {}
    for name, *shown in core.allgather_object(mine, name="devices"):
        hosts.setdefault(name, []).append(shown)
    where = "this machine" if len(hosts) == 1 else "host {}"
    devices = [_host_device(cfg.train.device, shown, framework, where.format(name)) for name, shown in hosts.items()]
    device = next((device for device in devices if device.kind == "cpu"), devices[0])
    check_autocast(cfg, device)
    return device


def _host_device(requested, shown, framework, where):
    """The Device of a host's ranks from what each shows: (ranks on the host, GPUs it sees,
    CUDA_VISIBLE_DEVICES, the PCI bus id of the GPU it would take). The host's first rank speaks
    for it, unless the ranks would take GPUs all different from each other's while each sees
    fewer than there are ranks: a GPU of its own each, as a scheduler showed them."""
    ranks, gpus, visible, _ = shown[0]
    taken = [bus_id for *_, bus_id in shown]
    if 0 < gpus < ranks and None not in taken and len(set(taken)) == len(taken):
        return Device("cuda", f"train.device={requested}: one GPU per rank, each of the {ranks} ranks on {where} "
                              f"shown its own ({VISIBLE_DEVICES_VARIABLE} per rank)")
    return choose(requested, ranks, gpus, framework, where, visible)


def gpu_bus_id(index):
    """The PCI bus id of the CUDA device `index` among those this process sees, from the driver
    (so CUDA_VISIBLE_DEVICES applies, and no framework is asked); None without a driver or such
    a device."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, bus_id = ctypes.c_int(), ctypes.create_string_buffer(32)
    if (driver.cuInit(0) != 0 or driver.cuDeviceGet(ctypes.byref(device), index) != 0
            or driver.cuDeviceGetPCIBusId(bus_id, len(bus_id), device) != 0):
        return None
    return bus_id.value.decode()


def _count(number, noun):
    return f"{number} {noun}" + ("" if number == 1 else "s")
