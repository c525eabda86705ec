"""scripts/bench_optimizer_overhead.py: the plain loop, hvdtrain's and DDP's in one process, on a
torchvision model too, and a step that differs from the plain one stops it."""

import json
import subprocess
import sys

import pytest
import torch

from support.scripts import SCRIPTS, load_script


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC", "0")  # the script's default of 1 stays out of this process
    return load_script("bench_optimizer_overhead")


def test_a_torchvision_model_trains_through_both_optimizers_in_one_process():
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_optimizer_overhead.py"), "--model", "resnet18",
                           "--batch-size", "2", "--steps", "1", "--rounds", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert (result["model"], result["gradient_tensors"], result["rounds"]) == ("resnet18", 62, 2)
    assert result["hvdtrain_over_plain"] > 0


def test_ddp_trains_in_the_same_turns_to_the_same_weights():
    """--ddp: a third loop, PyTorch DDP in a process group of one (gloo), whose Linear layers must
    end bit for bit where the plain loop's do (the script stops otherwise)."""
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_optimizer_overhead.py"), "--ddp", "--layers", "4",
                           "--steps", "2", "--rounds", "3"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["ddp_ms_per_step"] > 0 and result["hvdtrain_over_ddp"] > 0


def test_amp_is_refused_without_a_gpu_model():
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_optimizer_overhead.py"), "--amp"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--amp trains a torchvision model (--model) on a GPU (--device cuda)" in done.stderr


def steps(bench, factors):
    """Two equal models, each with a step that applies its SGD step `factor` times, as
    check_same_step takes them: the plain net, its step, and the other as hvdtrain's loop."""
    nets = [bench.linear_layers(3, "cpu") for _ in factors]
    inputs = torch.randn(4, 16)

    def step_of(net, factor):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        one_step = bench.step_function(net, optimizer, inputs, None)

        def step():
            for _ in range(factor):
                one_step()
        return step
    (plain_net, net), (plain_step, step) = nets, [step_of(net, factor) for net, factor in zip(nets, factors)]
    return plain_net, plain_step, [("hvdtrain", net, step)]


def test_equal_steps_pass_the_check(bench):
    bench.check_same_step(*steps(bench, (1, 1)))


def test_a_step_that_differs_from_the_plain_one_stops_the_run(bench):
    with pytest.raises(SystemExit, match=r"hvdtrain's step is not the plain one: 0\.weight changed differently"):
        bench.check_same_step(*steps(bench, (1, 2)))
