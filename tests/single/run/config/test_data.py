"""The `data` section (hvdtrain/run/config/data.py): MNIST-1D's keys, refused with the key where
they cannot run and set by data=mnist1d where not given; a data source and a model that take
other inputs are refused together; a dry run needs no data.root; where an ImageFolder tree is
decoded (data.decode), and the choices refused where they cannot run."""

from pathlib import Path

import pytest

from hvdtrain.run.config import ConfigError, validate
from hvdtrain.run.config.data import decoder

from support.configs import compose

MNIST1D = ["recipe=mnist1d"]
IMAGENET = ["recipe=resnet50_imagenet", "dry_run=true"]
REFUSED = {
    "no samples": (MNIST1D + ["data.num_samples=0"], "data.num_samples=0: must be a positive multiple of 10 (the "
                                                     "package makes data.num_samples / 10 samples of each digit)"),
    "samples not a multiple of 10": (MNIST1D + ["data.num_samples=1005"], "data.num_samples=1005: must be a positive "
                                                                         "multiple of 10"),
    "a seed NumPy refuses": (MNIST1D + ["data.seed=-1"], "data.seed=-1: must be in [0, 2**32)"),
    "a size of mnist1d's split": (MNIST1D + ["data.train_size=100"], "data.train_size=100: mnist1d's split follows "
                                                                     "data.num_samples (80 % for training)"),
    "mnist1d without a cache": (MNIST1D + ["data.cache_dir=null"], "data.cache_dir=None: data.source=mnist1d needs it"),
    "an mnist1d key with other data": (["data.seed=3"], "data.seed=3: applies to data.source=mnist1d only"),
    "an mnist1d model with digits": (["model=mnist1d_cnn"], "data.source='digits': gives digits inputs but model "
                                                            "mnist1d_cnn takes signal inputs; data sources for it: "
                                                            "mnist1d"),
    "a digits model with mnist1d": (MNIST1D + ["model=digits_mlp"], "data.source='mnist1d': gives signal inputs but "
                                                                    "model digits_mlp takes digits inputs"),
    "other classes": (MNIST1D + ["model.num_classes=5"], "model.num_classes=5: the mnist1d data set has 10 classes"),
    "an unknown decoder": (["data.decode=dali"], "data.decode='dali': allowed: auto, cpu, gpu"),
    "the gpu decoder for digits": (["data.decode=gpu"], "data.decode='gpu': gpu decodes the JPEGs of an ImageFolder "
                                                        "tree (data.source=imagefolder) only"),
    "the gpu decoder with tensorflow": (IMAGENET + ["data.decode=gpu", "recipe.framework=tensorflow"],
                                        "data.decode='gpu': gpu is torch's (torchvision's nvJPEG decoder)"),
    "the gpu decoder on the cpu": (IMAGENET + ["data.decode=gpu", "train.device=cpu"],
                                   "data.decode='gpu': gpu needs the ranks to train on CUDA, not train.device=cpu"),
    "an unknown bad files choice": (["data.bad_files=ignore"], "data.bad_files='ignore': allowed: stop, skip"),
    "skipping bad files with tensorflow": (IMAGENET + ["data.bad_files=skip", "recipe.framework=tensorflow"],
                                           "data.bad_files='skip': skip is torch's"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_data_values_that_cannot_run_are_refused_with_the_key(case):
    overrides, problem = REFUSED[case]
    with pytest.raises(ConfigError) as error:
        validate(compose(*overrides))
    assert str(error.value).startswith(f"invalid config: {problem}") and "\n" not in str(error.value)


def test_the_mnist1d_recipe_makes_the_papers_data_set():
    assert compose("recipe=mnist1d").data.num_samples == 5000


def test_data_mnist1d_sets_its_keys():
    cfg = compose("data=mnist1d", "model=mnist1d_mlp")
    validate(cfg)
    assert (cfg.data.source, cfg.data.num_samples, cfg.data.seed, cfg.model.name) == ("mnist1d", 100000, 42,
                                                                                      "mnist1d_mlp")


def test_the_mnist1d_cache_lies_beside_the_runs_of_the_directory_it_started_in():
    assert compose("data=mnist1d").data.cache_dir == str(Path.cwd() / "runs" / ".cache")


def test_imagenet_has_its_size_and_a_dry_run_needs_no_data_root():
    imagenet = compose("recipe=resnet50_imagenet", "dry_run=true")
    assert (imagenet.data.train_size, imagenet.data.val_size) == (1281167, 50000)
    validate(imagenet)  # no data.root: a dry run does not read the data


def test_an_imagefolder_tree_of_unknown_size_leaves_it_unset():
    assert compose("recipe=resnet50_imagenet", "data=imagefolder", "dry_run=true").data.train_size is None


@pytest.mark.parametrize("overrides, framework, device, chosen", [
    ((), "torch", "cuda", "gpu"),
    ((), "torch", "cpu", "cpu"),
    ((), "torch", "auto", "auto"),
    ((), "tensorflow", "cuda", "cpu"),
    (("data.decode=cpu",), "torch", "cuda", "cpu"),
    (("data.decode=gpu",), "torch", "cuda", "gpu"),
], ids=["auto on cuda", "auto on the cpu", "auto before the device is known", "auto with tensorflow",
        "cpu on cuda", "gpu on cuda"])
def test_an_imagefolder_trees_decoder_follows_data_decode_and_the_device(overrides, framework, device, chosen):
    assert decoder(compose(*IMAGENET, *overrides).data, framework, device)[0] == chosen


def test_other_data_has_no_decoder():
    assert decoder(compose().data, "torch", "cuda") == (None, "")
