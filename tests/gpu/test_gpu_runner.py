"""The runner on CUDA GPUs (skipped without one): one GPU per rank, up to 2 ranks. The digits
recipe trains on `train.device=cuda`, goes on on the CPU from its GPU checkpoint
(`resume=DIR train.device=cpu`) and back on the GPU from the CPU's; the synthetic recipe trains
a ResNet-50 with fp16 (GradScaler) and bf16 autocast, channels_last inputs and loader worker
processes; the default recipe runs as it is; the plan and the refusals count this machine's GPUs."""

import io
import json

import pytest
import torch

from hvdtrain.reporting.run_log import read_history
from support.commands import newest_checkpoint, results_of, run_hvdtrain

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (torch.cuda.is_available() is False)")

TIMEOUT = 600
GPUS = torch.cuda.device_count()
RANKS = min(2, GPUS)  # one GPU per rank


def decoded(data):
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def saved_from_a_gpu(run_dir):
    """Whether the newest checkpoint's tensors were saved from CUDA memory (their pickle says where)."""
    import zipfile

    newest = sorted((run_dir / "checkpoints").glob("step-*.ckpt"))[-1]
    with zipfile.ZipFile(newest) as members:
        return b"cuda" in members.read("state")


def trained(*args):
    result = run_hvdtrain(*args, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def digits_on_cuda(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("digits") / "run"
    result = trained("train.device=cuda", f"cluster.slots={RANKS}", "train.epochs=2", f"hydra.run.dir={run_dir}")
    return run_dir, result


def test_the_digits_recipe_trains_on_cuda(digits_on_cuda):
    run_dir, result = digits_on_cuda
    plural = "" if GPUS == 1 else "s"
    assert (f"  device       cuda (train.device=cuda: one GPU per rank; torch sees {GPUS} CUDA device{plural} "
            f"for {RANKS} rank") in result.stdout
    results = results_of(run_dir)
    assert (results["world_size"], results["epochs_completed"]) == (RANKS, 2)
    assert results["metrics"]["val_top1"] > 80.0
    assert saved_from_a_gpu(run_dir)
    steps = results["samples_trained"] // results["global_batch_size"]
    losses = [record["loss"] for record in read_history(run_dir / "metrics.jsonl") if record["event"] == "train"]
    assert len(losses) >= steps // 5 and all(loss > 0 for loss in losses)  # read every log_every_steps (5)


def test_a_gpus_run_goes_on_on_the_cpu_and_back(digits_on_cuda):
    run_dir, _ = digits_on_cuda
    on_cpu = trained(f"resume={run_dir}", "train.epochs=3", "train.device=cpu")
    assert "goes on with train.device=cpu (it was started with train.device=cuda)" in on_cpu.stdout
    assert "hvdtrain: resuming at epoch 2, step 0" in on_cpu.stdout
    assert "  device       cpu (train.device=cpu)" in on_cpu.stdout
    assert results_of(run_dir)["epochs_completed"] == 3 and not saved_from_a_gpu(run_dir)

    back = trained(f"resume={run_dir}", "train.epochs=4", "train.device=cuda")
    assert "hvdtrain: resuming at epoch 3, step 0" in back.stdout
    results = results_of(run_dir)
    assert results["epochs_completed"] == 4 and results["metrics"]["val_top1"] > 80.0
    assert saved_from_a_gpu(run_dir)
    state = newest_checkpoint(run_dir, decoded)
    assert state["epoch"] == 4 and all("momentum_buffer" in s for s in state["optimizer"]["state"].values())


@pytest.mark.parametrize("autocast", ["fp16", "bf16"])
def test_the_synthetic_recipe_trains_on_cuda(autocast, tmp_path):
    run_dir = tmp_path / "run"
    trained("recipe=synthetic", "model=resnet50", "train.device=cuda", f"cluster.slots={RANKS}",
            f"train.autocast={autocast}", "train.channels_last=true", "data.loader_workers=2",
            f"data.train_size={RANKS * 8 * 6}", "data.val_size=16", "data.image_size=64", "data.resize_size=64",
            "train.batch_size=8", "train.log_every_steps=2", f"hydra.run.dir={run_dir}")
    results = results_of(run_dir)
    assert results["epochs_completed"] == 1 and results["samples_trained"] == RANKS * 8 * 6
    assert results["train_samples_per_s"] > 0 and "val_top1" in results["metrics"]
    scaler = newest_checkpoint(run_dir, decoded)["scaler"]
    assert bool(scaler) == (autocast == "fp16")  # GradScaler only for fp16
    if scaler:
        assert scaler["scale"] > 0


def test_the_default_recipe_runs_on_a_machine_with_gpus(tmp_path):
    """2 local ranks: on 2 GPUs where there are, else on the CPU (auto), never refused."""
    result = trained("train.epochs=1", f"hydra.run.dir={tmp_path / 'run'}")
    expected = "cuda" if GPUS >= 2 else "cpu"
    assert f"  device       {expected} (train.device=auto" in result.stdout
    assert results_of(tmp_path / "run")["epochs_completed"] == 1


def test_the_plan_and_the_refusals_count_this_machines_gpus(tmp_path):
    plan = json.loads(trained("dry_run=true").stdout)
    assert (plan["device"], plan["gpus_per_host"]) == (("cuda", 2) if GPUS >= 2 else ("cpu", None))
    refused = run_hvdtrain("train.device=cuda", f"cluster.slots={GPUS + 1}", f"hydra.run.dir={tmp_path / 'run'}")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.startswith(f"hvdtrain: invalid config: cluster.slots={GPUS + 1}: {GPUS + 1} ranks on "
                                     f"this machine but torch sees {GPUS} CUDA device")
    assert not (tmp_path / "run").exists()


def test_the_driver_names_each_gpu_by_the_pci_bus_id_cuda_gives_it():
    """What the ranks compare to tell GPUs apart where each is shown its own (run/devices.py)."""
    import cupy

    from hvdtrain.run import devices

    for index in range(GPUS):
        assert devices.gpu_bus_id(index).lower() == cupy.cuda.runtime.deviceGetPCIBusId(index).lower()
    assert devices.gpu_bus_id(GPUS) is None
