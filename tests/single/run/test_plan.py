"""The plan of a run (hvdtrain/run/plan.py): the steps of an epoch from the data's size where it
is known before any data is loaded (ImageNet, MNIST-1D), none where it is not; a data set smaller
than one global batch is refused with the numbers; the summary says the device and why, and
where an ImageFolder tree is decoded; decoding on the GPU for ranks on the CPU is refused."""

import pytest
from mnist1d.data import get_dataset_args

from hvdtrain.run import devices, hosts
from hvdtrain.run.config import ConfigError
from hvdtrain.run.config.data import MNIST1D_TRAIN_SPLIT
from hvdtrain.run.devices import CPU
from hvdtrain.run.hosts import Host
from hvdtrain.run.plan import make_plan, summary

from support.configs import compose


def plan_of(*overrides):
    cfg = compose(*overrides)
    return make_plan(cfg, hosts.resolve_hosts(cfg.cluster), CPU)


def test_the_plan_knows_imagenets_steps_per_epoch():
    assert plan_of("recipe=resnet50_imagenet", "dry_run=true").steps_per_epoch == 1281167 // 8 // 32


def test_the_plan_leaves_the_steps_of_a_data_set_of_unknown_size_open():
    assert plan_of("recipe=resnet50_imagenet", "data=imagefolder", "dry_run=true").steps_per_epoch is None


def test_a_data_set_smaller_than_one_global_batch_is_refused():
    with pytest.raises(ConfigError) as error:
        plan_of("train.batch_size=1000")
    assert str(error.value) == ("invalid config: data.train_size=1437: 1437 training samples, fewer than one global "
                                "batch (2000 = 2 ranks x train.batch_size=1000 x train.backward_passes_per_step=1)")


def test_mnist1d_keeps_the_packages_split():
    assert MNIST1D_TRAIN_SPLIT == get_dataset_args().train_split


def test_the_plan_knows_mnist1ds_training_samples_before_the_data_is_made():
    assert plan_of("recipe=mnist1d", "dry_run=true").steps_per_epoch == (4000 // 2) // 32  # 80 % of 5,000; 2 x 32


def test_an_mnist1d_set_smaller_than_one_global_batch_is_refused():
    with pytest.raises(ConfigError, match=r"data.num_samples=50: 40 training samples, fewer than one global batch "
                                          r"\(64 = 2 ranks"):
        plan_of("recipe=mnist1d", "data.num_samples=50")


def test_the_summary_says_the_device_and_why():
    cfg = compose()
    plan = make_plan(cfg, [Host("localhost", 2)], devices.choose("auto", 2, 1, "torch", "this machine"))
    assert ("  device       cpu (train.device=auto: torch sees 1 CUDA device for 2 ranks on this machine, and each "
            "rank needs a GPU of its own; cluster.slots=1 would train on CUDA)") in summary(plan, cfg, "r")


def test_the_summary_says_where_an_imagefolder_tree_is_decoded_and_why():
    cfg = compose("recipe=resnet50_imagenet", "dry_run=true")
    text = summary(make_plan(cfg, hosts.resolve_hosts(cfg.cluster), CPU), cfg, "runs/x")
    assert "  decode       cpu (data.decode=auto: the ranks train on the CPU; PIL in 4 loader processes)" in text


def test_decoding_on_the_gpu_for_ranks_that_train_on_the_cpu_is_refused():
    with pytest.raises(ConfigError, match=r"^invalid config: data.decode=gpu: the ranks train on the CPU "
                                          r"\(train.device=cpu\); use data.decode=auto or cpu$"):
        plan_of("recipe=resnet50_imagenet", "dry_run=true", "data.decode=gpu")
