"""The ResNet-50 ImageNet recipe's training loop (hvdtrain/training/train_torch.py) on 2 and 3 ranks
that share the one GPU through NCCL, joined as hosts of their own (gpu/support.py): a short run from
a generated ImageNet-shaped tree with data.decode=gpu and bf16 trains every sample of its epoch,
counts the files the GPU could not decode and checkpoints. The `hvdtrain` command gives each rank a
GPU of its own and refuses more ranks than GPUs (run/devices.py), so the ranks run the loop itself,
as the worker does after that check."""

from pathlib import Path
from unittest import mock

import pytest

from gpu.support import RANKS_AS_HOSTS, gpu_of_local_rank
from hvdtrain.tasks.image_tree import make_image_tree
from support.commands import results_of

CLASSES, PER_CLASS, BATCH = 4, 12, 4


def ranks_recipe(root, run_dir):
    import hvdtrain.torch as hvd
    from hvdtrain.run.devices import Device
    from hvdtrain.training.train_torch import train
    from support.configs import compose

    hvd.init()
    gpu_of_local_rank(hvd)
    cfg = compose("recipe=resnet50_imagenet", f"data.root={root}", f"model.num_classes={CLASSES}",
                  f"train.batch_size={BATCH}", "train.epochs=1", "schedule.warmup_epochs=1", "train.autocast=bf16",
                  "train.channels_last=true", "data.decode=gpu", "data.loader_workers=2")
    # Each rank is the first and only of its host, as NCCL is told: the loop puts a rank on the
    # GPU of its local rank, which is GPU 0 for every one of them here.
    with mock.patch.object(hvd, "local_rank", lambda: 0):
        train(cfg, Path(run_dir), Device("cuda", "ranks as hosts of their own on one GPU"))
    print(f"rank {hvd.rank()} recipe ok", flush=True)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    make_image_tree(root, classes=CLASSES, train_per_class=PER_CLASS, val_per_class=2, seed=5)
    return root


@pytest.mark.parametrize("num_proc", [2, 3])
def test_the_imagenet_recipe_trains_on_ranks_sharing_a_gpu_through_nccl(mpirun, tree, tmp_path, num_proc):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = mpirun(num_proc, ranks_recipe, tree, run_dir, timeout=400, env=RANKS_AS_HOSTS)
    assert all(f"rank {r} recipe ok" in result.stdout for r in range(num_proc)), result.stdout
    results = results_of(run_dir)
    steps = CLASSES * PER_CLASS // (num_proc * BATCH)
    assert (results["world_size"], results["epochs_completed"]) == (num_proc, 1)
    assert results["samples_trained"] == steps * num_proc * BATCH
    assert results["inputs_last_epoch"]["decoded_on_cpu"] == 2  # the CMYK JPEG and the PNG
    assert list((run_dir / "checkpoints").glob("step-*.ckpt"))
