"""The device a run trains on (hvdtrain/run/devices.py), on a machine that pretends to have 0, 1
or 2 GPUs: train.device=auto takes CUDA only with a GPU for every local rank, cuda without one
is refused before launch with the numbers, hosts other than this machine decide when the job
starts, the ranks of a job agree on one device (also where each rank is shown a GPU of its own, as
Slurm's --gpus-per-task does), and fp16 needs CUDA."""

import ctypes

import pytest

from hvdtrain.launch import cli, mpirun
from hvdtrain.run import devices
from hvdtrain.run.config import ConfigError
from hvdtrain.run.devices import Device
from hvdtrain.run.hosts import Host

from support.configs import compose

ELSEWHERE = [Host("gpu01", 4), Host("gpu02", 4)]


@pytest.fixture
def gpus(monkeypatch):
    """pretend(n): this machine shows n CUDA devices to every framework."""
    def pretend(count):
        monkeypatch.setattr(devices, "visible_gpus", lambda framework: count)

    return pretend


@pytest.fixture
def no_launch(monkeypatch):
    def launch(command, **options):
        raise AssertionError("launched")

    monkeypatch.setattr(mpirun, "started", launch)


@pytest.mark.parametrize("requested,ranks,count,expected", [
    ("cpu", 2, 2, Device("cpu", "train.device=cpu")),
    ("auto", 2, 0, Device("cpu", "train.device=auto: torch sees no CUDA device on this machine")),
    ("auto", 2, 1, Device("cpu", "train.device=auto: torch sees 1 CUDA device for 2 ranks on this machine, and "
                                 "each rank needs a GPU of its own; cluster.slots=1 would train on CUDA")),
    ("auto", 2, 2, Device("cuda", "train.device=auto: one GPU per rank; torch sees 2 CUDA devices for 2 ranks on "
                                  "this machine")),
    ("cuda", 1, 4, Device("cuda", "train.device=cuda: one GPU per rank; torch sees 4 CUDA devices for 1 rank on "
                                  "this machine")),
])
def test_the_device_follows_the_gpus_a_host_has_for_its_ranks(requested, ranks, count, expected):
    assert devices.choose(requested, ranks, count, "torch", "this machine") == expected


def test_cuda_with_fewer_gpus_than_ranks_is_refused_with_the_numbers():
    with pytest.raises(ConfigError) as error:
        devices.choose("cuda", 4, 2, "torch", "this machine", visible_devices="0,1")
    assert str(error.value) == (
        "invalid config: cluster.slots=4: 4 ranks on this machine but torch sees 2 CUDA devices with "
        "CUDA_VISIBLE_DEVICES='0,1'; train.device=cuda takes one GPU per rank: set cluster.slots=2 or fewer, "
        "or train.device=cpu")


@pytest.mark.parametrize("count,device,gpus_per_host", [(0, "cpu", None), (1, "cpu", None), (2, "cuda", 2)])
def test_the_default_recipe_plans_its_device_from_this_machines_gpus(gpus, tmp_path, count, device, gpus_per_host):
    gpus(count)
    plan, _ = cli._launch_plan(compose(), tmp_path)
    assert (plan.device, plan.gpus_per_host) == (device, gpus_per_host)
    assert plan.as_json()["device_reason"].startswith("train.device=auto: ")


@pytest.fixture
def gpus_not_asked(monkeypatch):
    def not_asked(framework):
        raise AssertionError("this machine's GPUs say nothing about other hosts'")

    monkeypatch.setattr(devices, "visible_gpus", not_asked)


def test_auto_on_other_hosts_is_decided_when_the_job_starts(gpus_not_asked):
    assert devices.planned(compose("cluster=2x4"), ELSEWHERE).kind == "auto"


def test_cuda_on_other_hosts_is_checked_by_each_host_when_the_job_starts(gpus_not_asked):
    cuda = devices.planned(compose("cluster=2x4", "train.device=cuda"), ELSEWHERE)
    assert cuda == Device("cuda", "train.device=cuda: one GPU per rank, checked by each host when the job starts")


REFUSED_HERE = {
    "more ranks than GPUs": (["train.device=cuda", "cluster.slots=4"], 2,
     "invalid config: cluster.slots=4: 4 ranks on this machine but torch sees 2 CUDA devices; train.device=cuda "
     "takes one GPU per rank: set cluster.slots=2 or fewer, or train.device=cpu"),
    "no GPU for tensorflow": (["train.device=cuda", "recipe.framework=tensorflow"], 0,
     "invalid config: train.device='cuda': no CUDA device visible to tensorflow on this machine; use "
     "train.device=auto (a GPU where there is one) or train.device=cpu"),
    "fp16 where auto comes out as the CPU": (["train.autocast=fp16"], 1,
     "invalid config: train.autocast='fp16': float16 autocast is for CUDA, with a GradScaler, and this run trains "
     "on the CPU (train.device=auto: torch sees 1 CUDA device for 2 ranks on this machine, and each rank needs a "
     "GPU of its own; cluster.slots=1 would train on CUDA); use train.autocast=bf16 on the CPU"),
}


def refused_here(case, gpus, monkeypatch, tmp_path):
    """The ConfigError `hvdtrain OVERRIDES` meets on this machine with the case's GPUs."""
    overrides, count, _ = REFUSED_HERE[case]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus(count)
    with pytest.raises(ConfigError) as error:
        cli.run(compose(*overrides), tmp_path)
    return error.value


@pytest.mark.parametrize("case", REFUSED_HERE)
def test_a_device_this_machine_cannot_give_is_refused_before_launch(case, gpus, no_launch, monkeypatch, tmp_path):
    assert str(refused_here(case, gpus, monkeypatch, tmp_path)) == REFUSED_HERE[case][2]


@pytest.mark.parametrize("case", REFUSED_HERE)
def test_a_refused_device_leaves_no_run_directory(case, gpus, no_launch, monkeypatch, tmp_path):
    refused_here(case, gpus, monkeypatch, tmp_path)
    assert not (tmp_path / "config.yaml").exists()


def test_fp16_on_cuda_is_planned(gpus, tmp_path):
    gpus(2)
    plan, _ = cli._launch_plan(compose("train.autocast=fp16"), tmp_path)
    assert (plan.device, plan.gpus_per_host) == ("cuda", 2)


def job(monkeypatch, *hosts):
    """What the ranks of a job show each other, a host at a time: (host, ranks on it, GPUs each of
    them sees, CUDA_VISIBLE_DEVICES[, the PCI bus ids of the GPUs its ranks would take]); without
    the bus ids, the ranks see the same GPUs and each takes its local rank's."""
    from hvdtrain import core

    shown = []
    for name, ranks, gpus, visible, *taken in hosts:
        bus_ids = taken[0] if taken else [f"0000:{rank % gpus:02X}:00.0" if gpus else None for rank in range(ranks)]
        shown.extend((name, ranks, gpus, visible, bus_id) for bus_id in bus_ids)
    monkeypatch.setattr(core, "local_size", lambda: hosts[0][1])
    monkeypatch.setattr(core, "local_rank", lambda: 0)
    monkeypatch.setattr(core, "allgather_object", lambda mine, name: shown)
    monkeypatch.setattr(devices, "visible_gpus", lambda framework: hosts[0][2])
    monkeypatch.setattr(devices, "gpu_bus_id", lambda index: shown[0][4])


@pytest.fixture
def short_of_gpus(monkeypatch):
    """A job of two hosts of 4 ranks each, the second showing 2 GPUs only."""
    job(monkeypatch, ("gpu01", 4, 4, None), ("gpu02", 4, 2, "0,1"))


def test_ranks_with_a_gpu_each_on_every_host_agree_on_cuda(monkeypatch):
    job(monkeypatch, ("gpu01", 4, 4, None), ("gpu02", 4, 4, None))
    assert devices.agreed(compose("train.device=cuda")).kind == "cuda"
    assert devices.agreed(compose()).kind == "cuda"


def test_cuda_on_a_host_short_of_gpus_is_refused_naming_the_host(short_of_gpus):
    with pytest.raises(ConfigError) as error:
        devices.agreed(compose("train.device=cuda"))
    assert str(error.value) == (
        "invalid config: cluster.slots=4: 4 ranks on host gpu02 but torch sees 2 CUDA devices with "
        "CUDA_VISIBLE_DEVICES='0,1'; train.device=cuda takes one GPU per rank: set cluster.slots=2 or fewer, "
        "or train.device=cpu")


def test_auto_on_a_host_short_of_gpus_puts_every_rank_on_the_cpu(short_of_gpus):
    # rather than a job that runs at the pace of its CPU ranks
    assert devices.agreed(compose()) == Device(
        "cpu", "train.device=auto: torch sees 2 CUDA devices for 4 ranks on host gpu02, and each rank needs a GPU of "
               "its own; cluster.slots=2 would train on CUDA")


def test_fp16_on_the_agreed_cpu_is_refused(short_of_gpus):
    with pytest.raises(ConfigError, match="train.autocast='fp16': float16 autocast is for CUDA"):
        devices.agreed(compose("train.autocast=fp16"))


PER_RANK_GPUS = ["0000:07:00.0", "0000:0B:00.0", "0000:48:00.0", "0000:4C:00.0"]


def test_ranks_each_shown_a_gpu_of_their_own_agree_on_cuda(monkeypatch):
    # Slurm's --gpus-per-task=1: each rank sees one GPU, "0" to each, a different one in each
    job(monkeypatch, ("gpu01", 4, 1, "0", PER_RANK_GPUS), ("gpu02", 4, 1, "0", PER_RANK_GPUS))
    assert devices.agreed(compose("train.device=cuda")) == Device(
        "cuda", "train.device=cuda: one GPU per rank, each of the 4 ranks on host gpu01 shown its own "
                "(CUDA_VISIBLE_DEVICES per rank)")
    assert devices.agreed(compose()).kind == "cuda"


def test_ranks_shown_one_gpu_they_would_share_are_refused(monkeypatch):
    job(monkeypatch, ("gpu01", 4, 1, "0", PER_RANK_GPUS[:3] + PER_RANK_GPUS[:1]))
    with pytest.raises(ConfigError, match="cluster.slots=4: 4 ranks on this machine but torch sees 1 CUDA device"):
        devices.agreed(compose("train.device=cuda"))
    assert devices.agreed(compose()).kind == "cpu"


def test_ranks_whose_gpus_the_driver_cannot_name_are_counted_as_before(monkeypatch):
    job(monkeypatch, ("gpu01", 2, 1, "0", [None, None]))
    assert devices.agreed(compose()).kind == "cpu"


def _cuda_driver():
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_cuda_driver(), reason="this machine has a CUDA driver (tests/gpu/test_gpu_runner.py)")
def test_without_a_cuda_driver_no_gpu_is_named():
    assert devices.gpu_bus_id(0) is None
