"""The device a run trains on (hvdtrain/runner/devices.py), on a machine that pretends to have 0, 1
or 2 GPUs: train.device=auto takes CUDA only with a GPU for every local rank, cuda without one
is refused before launch with the numbers (or by the ranks, for hosts the command cannot see),
the plan says which and why; train.autocast, train.channels_last and resume's train.device."""

import json
import sys

import pytest

from hvdtrain.launch import cli, mpirun as launcher
from hvdtrain.run import devices
from hvdtrain.run.config import ConfigError, validate
from hvdtrain.run.run_dir import claim_run_dir
from hvdtrain.run.devices import Device
from hvdtrain.run.hosts import Host

from support.commands import run_hvdtrain
from support.configs import compose

HERE = [Host("localhost", 2)]
ELSEWHERE = [Host("gpu01", 4), Host("gpu02", 4)]
TIMEOUT = 120


@pytest.fixture
def gpus(monkeypatch):
    """pretend(n): this machine shows n CUDA devices to every framework."""
    def pretend(count):
        monkeypatch.setattr(devices, "visible_gpus", lambda framework: count)

    return pretend


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


def test_hosts_other_than_this_machine_decide_at_start(monkeypatch):
    def not_asked(framework):
        raise AssertionError("this machine's GPUs say nothing about other hosts'")

    monkeypatch.setattr(devices, "visible_gpus", not_asked)
    assert devices.planned(compose("cluster=2x4"), ELSEWHERE).kind == "auto"
    cuda = devices.planned(compose("cluster=2x4", "train.device=cuda"), ELSEWHERE)
    assert cuda == Device("cuda", "train.device=cuda: one GPU per rank, checked by each host when the job starts")


def test_the_summary_says_the_device_and_why():
    from hvdtrain.run.plan import make_plan, summary

    cfg = compose()
    plan = make_plan(cfg, HERE, devices.choose("auto", 2, 1, "torch", "this machine"))
    assert ("  device       cpu (train.device=auto: torch sees 1 CUDA device for 2 ranks on this machine, and each "
            "rank needs a GPU of its own; cluster.slots=1 would train on CUDA)") in summary(plan, cfg, "r")


@pytest.fixture
def no_launch(monkeypatch):
    def launch(command, **options):
        raise AssertionError("launched")

    monkeypatch.setattr(launcher, "started", launch)


@pytest.mark.parametrize("overrides,count,message", [
    (["train.device=cuda", "cluster.slots=4"], 2,
     "invalid config: cluster.slots=4: 4 ranks on this machine but torch sees 2 CUDA devices; train.device=cuda "
     "takes one GPU per rank: set cluster.slots=2 or fewer, or train.device=cpu"),
    (["train.device=cuda", "recipe.framework=tensorflow"], 0,
     "invalid config: train.device='cuda': no CUDA device visible to tensorflow on this machine; use "
     "train.device=auto (a GPU where there is one) or train.device=cpu"),
    (["train.autocast=fp16"], 1,
     "invalid config: train.autocast='fp16': float16 autocast is for CUDA, with a GradScaler, and this run trains "
     "on the CPU (train.device=auto: torch sees 1 CUDA device for 2 ranks on this machine, and each rank needs a "
     "GPU of its own; cluster.slots=1 would train on CUDA); use train.autocast=bf16 on the CPU"),
])
def test_a_device_this_machine_cannot_give_is_refused_before_launch(gpus, no_launch, monkeypatch, tmp_path, overrides,
                                                                    count, message):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus(count)
    with pytest.raises(ConfigError) as error:
        cli.run(compose(*overrides), tmp_path)
    assert str(error.value) == message
    assert not (tmp_path / "config.yaml").exists()


def test_fp16_on_cuda_is_planned(gpus, tmp_path):
    gpus(2)
    plan, _ = cli._launch_plan(compose("train.autocast=fp16"), tmp_path)
    assert (plan.device, plan.gpus_per_host) == ("cuda", 2)


class Job:
    """What the ranks of a job show each other: (host, ranks on it, GPUs it shows, CUDA_VISIBLE_DEVICES)."""

    def __init__(self, monkeypatch, *hosts):
        from hvdtrain import core

        shown = [host for host in hosts for _ in range(host[1])]
        monkeypatch.setattr(core, "local_size", lambda: hosts[0][1])
        monkeypatch.setattr(core, "allgather_object", lambda mine, name: shown)
        monkeypatch.setattr(devices, "visible_gpus", lambda framework: hosts[0][2])


def test_the_ranks_of_a_job_agree_on_one_device(monkeypatch):
    Job(monkeypatch, ("gpu01", 4, 4, None), ("gpu02", 4, 4, None))
    assert devices.agreed(compose("train.device=cuda")).kind == "cuda"
    assert devices.agreed(compose()).kind == "cuda"

    Job(monkeypatch, ("gpu01", 4, 4, None), ("gpu02", 4, 2, "0,1"))
    with pytest.raises(ConfigError) as error:
        devices.agreed(compose("train.device=cuda"))
    assert str(error.value) == (
        "invalid config: cluster.slots=4: 4 ranks on host gpu02 but torch sees 2 CUDA devices with "
        "CUDA_VISIBLE_DEVICES='0,1'; train.device=cuda takes one GPU per rank: set cluster.slots=2 or fewer, "
        "or train.device=cpu")
    # auto: all ranks on the CPU, rather than a job that runs at the pace of its CPU ranks
    assert devices.agreed(compose()) == Device(
        "cpu", "train.device=auto: torch sees 2 CUDA devices for 4 ranks on host gpu02, and each rank needs a GPU of "
               "its own; cluster.slots=2 would train on CUDA")
    with pytest.raises(ConfigError, match="train.autocast='fp16': float16 autocast is for CUDA"):
        devices.agreed(compose("train.autocast=fp16"))


def test_a_job_the_command_could_not_check_is_refused_by_its_ranks_in_one_line(tmp_path):
    """Inside an mpirun job (as on hosts the `hvdtrain` command cannot see) the ranks check their
    devices together: each says nothing but rank 0's line, and none prints a traceback."""
    environment = {**launcher.worker_environment(2), "CUDA_VISIBLE_DEVICES": ""}
    program = [sys.executable, "-m", "hvdtrain.launch.cli", "train.device=cuda", f"hydra.run.dir={tmp_path / 'run'}"]
    result = launcher.run(launcher.mpirun_command(program, num_proc=2, env=environment), env=environment,
                          timeout=TIMEOUT, capture=True)
    assert result.returncode != 0
    assert "Traceback" not in result.stdout
    line = ("hvdtrain: invalid config: train.device='cuda': no CUDA device visible to torch on this machine with "
            "CUDA_VISIBLE_DEVICES=''; use train.device=auto (a GPU where there is one) or train.device=cpu\n")
    assert result.stdout.count("hvdtrain: invalid config") == 1 and line in result.stdout


CONFIG_PROBLEMS = {
    "fp16 on the CPU": (["train.autocast=fp16", "train.device=cpu"],
                        "train.autocast='fp16': float16 autocast is for CUDA, with a GradScaler; on the CPU "
                        "(train.device=cpu) use bf16"),
    "fp16 with tensorflow": (["train.autocast=fp16", "recipe.framework=tensorflow"],
                             "train.autocast='fp16': the tensorflow loop has no loss scaling; use bf16 (Keras's "
                             "mixed_bfloat16 policy)"),
    "channels_last for digits": (["train.channels_last=true"],
                                 "train.channels_last=True: applies to image models (resnet50, resnet101, resnet152, "
                                 "vgg16, inception_v3), not digits_mlp"),
    "an integer for autocast": (["train.autocast=1"],
                                "train.autocast='1': allowed: none, bf16, fp16"),
}


@pytest.mark.parametrize("case", CONFIG_PROBLEMS)
def test_precision_and_layout_settings_that_cannot_run_are_refused(case):
    overrides, problem = CONFIG_PROBLEMS[case]
    with pytest.raises(ConfigError) as error:
        validate(compose(*overrides))
    assert str(error.value) == f"invalid config: {problem}"


@pytest.mark.parametrize("overrides", [
    ["train.autocast=bf16", "train.device=cpu"], ["train.autocast=fp16", "train.device=cuda"],
    ["recipe=synthetic", "train.channels_last=true"], ["recipe=synthetic", "train.channels_last=true",
                                                       "recipe.framework=tensorflow", "train.autocast=bf16"],
])
def test_precision_and_layout_settings_that_can_run_pass(overrides):
    validate(compose(*overrides))


@pytest.mark.parametrize("setting", ["true", "false"])
def test_autocast_takes_a_precision_not_a_boolean(setting):
    with pytest.raises(ConfigError, match=f"^invalid config: train.autocast='{setting.title()}': allowed: none, bf16, "
                                          f"fp16$"):
        validate(compose(f"train.autocast={setting}"))


def test_a_saved_config_with_a_boolean_autocast_is_refused_by_name(tmp_path):
    from hvdtrain.run.run_dir import load_run_config

    cfg = compose()
    claim_run_dir(cfg, tmp_path)
    text = (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(text.replace("autocast: none", "autocast: false"))
    with pytest.raises(ConfigError, match="train.autocast='False': allowed: none, bf16, fp16"):
        validate(load_run_config(tmp_path / "config.yaml"))


@pytest.fixture
def started_run(tmp_path):
    """A run directory as `hvdtrain` leaves it when its workers have not checkpointed yet."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    claim_run_dir(compose(), run_dir)
    return run_dir


def test_resume_takes_train_device_and_the_plan_shows_it(started_run):
    result = run_hvdtrain(f"resume={started_run}", "train.device=cpu", "dry_run=true")
    assert result.returncode == 0, result.stderr
    notice, plan = result.stdout.splitlines()
    assert notice == f"hvdtrain: {started_run} goes on with train.device=cpu (it was started with train.device=auto)"
    assert (json.loads(plan)["device"], json.loads(plan)["device_reason"]) == ("cpu", "train.device=cpu")
    assert "  device: auto\n" in (started_run / "config.yaml").read_text(), "a dry run writes nothing"


def test_resume_writes_train_device_into_the_run_once_it_may_start(started_run, gpus, no_launch, monkeypatch):
    """The workers read config.yaml: the command writes the new device there, after its checks."""
    gpus(0)
    with pytest.raises(ConfigError, match="no CUDA device visible"):
        cli.run(compose(f"resume={started_run}", "train.device=cuda"), started_run)
    assert "  device: auto\n" in (started_run / "config.yaml").read_text()
    with pytest.raises(AssertionError, match="launched"):
        cli.run(compose(f"resume={started_run}", "train.device=cpu"), started_run)
    assert "  device: cpu\n" in (started_run / "config.yaml").read_text()
