"""The configuration: every recipe composes and validates; the plan; bad input stops with one
clear message before anything launches."""

import io
import json
import sys
from pathlib import Path

import pytest

from hvdtrain.launch import cli
from hvdtrain.run import hosts as cluster
from hvdtrain.launch.compose import RECIPES_DIR
from hvdtrain.run.config import ConfigError, validate
from hvdtrain.run.config.recipe import FRAMEWORKS
from hvdtrain.run.job import progress_bar_wanted
from hvdtrain.run.devices import CPU
from hvdtrain.run.plan import make_plan

from support.commands import run_hvdtrain
from support.configs import compose

RECIPES = sorted(path.stem for path in RECIPES_DIR.glob("*.yaml"))
CLUSTERS = {"local": [], "1x8": [], "4x4": ["cluster.hosts=[h1,h2,h3,h4]"]}


def test_the_published_recipes_are_there():
    assert {"digits", "resnet50_imagenet", "resnet50_imagenet_8k", "resnet101_imagenet", "inception3_imagenet",
            "vgg16_imagenet", "resnet101_synthetic", "inception3_synthetic", "vgg16_synthetic"} <= set(RECIPES)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_and_validates_on_several_clusters(recipe, framework, image_tree):
    for layout, hosts in CLUSTERS.items():
        cfg = compose(f"recipe={recipe}", f"cluster={layout}", f"data.root={image_tree}",
                      f"recipe.framework={framework}", *hosts)
        if cfg.optimizer.name == "lars" and framework == "tensorflow":  # a LARS recipe is torch's only
            with pytest.raises(ConfigError, match="LARS is implemented for recipe.framework=torch only"):
                validate(cfg)
            continue
        validate(cfg)
        plan = make_plan(cfg, cluster.resolve_hosts(cfg.cluster), CPU)
        assert cfg.recipe.name == recipe and cfg.cluster.name == layout and cfg.recipe.framework == framework
        assert plan.world_size == cfg.cluster.num_hosts * cfg.cluster.slots
        assert plan.global_batch_size == plan.world_size * cfg.train.batch_size * cfg.train.backward_passes_per_step
        assert plan.peak_lr == pytest.approx(cfg.optimizer.base_lr * plan.global_batch_size / cfg.optimizer.base_batch_size)
        target = cfg.recipe.target
        assert target is None or (target.source and target.metric == "val_top1")
        header = (RECIPES_DIR / f"{recipe}.yaml").read_text()
        assert "Run:" in header and "Hardware:" in header and "Target:" in header


def test_the_recipes_take_their_settings_from_the_source():
    goyal_8k = compose("recipe=resnet50_imagenet_8k", "cluster.hosts=[" + ",".join(f"n{i}" for i in range(32)) + "]")
    plan = make_plan(goyal_8k, cluster.resolve_hosts(goyal_8k.cluster), CPU)
    assert (plan.global_batch_size, plan.peak_lr, plan.warmup_epochs) == (8192, 3.2, 5)
    assert list(goyal_8k.schedule.milestones) == [30, 60, 80] and goyal_8k.train.epochs == 90
    assert goyal_8k.model.zero_init_residual and list(goyal_8k.optimizer.exclude_from_weight_decay) == ["bn"]
    assert goyal_8k.recipe.target.value == pytest.approx(100 - 23.74)
    baseline = compose("recipe=resnet50_imagenet")
    plan = make_plan(baseline, cluster.resolve_hosts(baseline.cluster), CPU)
    assert (plan.global_batch_size, plan.peak_lr) == (256, 0.1)


def test_dry_run_of_resnet101_on_4x4_prints_the_plan():
    # The plan reads no data: a dry run needs no data.root (ImageNet's size is in its data config).
    result = run_hvdtrain("recipe=resnet101_imagenet", "cluster=4x4", "cluster.hosts=[h1,h2,h3,h4]",
                          "dry_run=true", "hydra.run.dir=runs/never-made")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)  # one JSON object and nothing else on stdout
    command = plan.pop("launch_command")
    assert plan == {
        "world_size": 16,
        "hosts": [{"host": "h1", "slots": 4}, {"host": "h2", "slots": 4}, {"host": "h3", "slots": 4},
                  {"host": "h4", "slots": 4}],
        "per_worker_batch_size": 32,
        "backward_passes_per_step": 1,
        "global_batch_size": 512,
        "base_lr": 0.1,
        "base_batch_size": 256,
        "peak_lr": 0.2,
        "warmup": "gradual",
        "warmup_epochs": 5.0,
        "epochs": 100,
        "steps_per_epoch": 2502,  # 1281167 ImageNet images // 16 ranks // 32
        "device": "auto",  # other hosts: their ranks decide when the job starts
        "gpus_per_host": None,
        "device_reason": "train.device=auto: decided when the job starts: CUDA if every host has a GPU for each "
                         "of its ranks, else the CPU",
        "restarts": 3,  # fault.max_restarts: hvdtrain launches this job, so it supervises it
        "predicted_efficiency": None,  # the prediction's cases: tests/runner/test_prediction.py
        "predicted_samples_per_s": None,
        "prediction_missing": "unknown: cluster.network.gbps (between hosts, e.g. cluster.network.gbps=25); one "
                              "device's throughput: measure it on a cuda device with profile=true in place of "
                              "dry_run=true (it writes runs/.profiles/resnet101_imagenet-resnet101-32-cuda.json), or "
                              "set recipe.reference_throughput",
    }
    assert command[0].endswith("mpirun") and command[command.index("-np") + 1] == "16"
    assert command[command.index("-H") + 1] == "h1:4,h2:4,h3:4,h4:4"
    assert command[-3:-1] == ["-m", "hvdtrain.training.worker"]


def test_dry_run_without_hosts_names_placeholders_and_a_real_launch_still_needs_them(tmp_path):
    result = run_hvdtrain("recipe=resnet101_imagenet", "cluster=4x4", "dry_run=true", "hydra.run.dir=runs/never-made")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["hosts"] == [{"host": f"<host{i}>", "slots": 4} for i in range(4)]
    assert (plan["world_size"], plan["global_batch_size"], plan["steps_per_epoch"]) == (16, 512, 2502)
    command = plan["launch_command"]
    assert command[command.index("-H") + 1] == "<host0>:4,<host1>:4,<host2>:4,<host3>:4"

    result = run_hvdtrain("recipe=resnet101_imagenet", "cluster=4x4", "data.root=/nowhere",
                          f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2
    assert result.stderr == ("hvdtrain: invalid config: data.root='/nowhere': has no train/ and no val/ directory "
                             "(an ImageFolder tree needs /nowhere/train and /nowhere/val)\n")


def test_the_plan_knows_imagenets_size_and_leaves_an_unknown_one_open():
    imagenet = compose("recipe=resnet50_imagenet", "dry_run=true")
    assert (imagenet.data.train_size, imagenet.data.val_size) == (1281167, 50000)
    assert make_plan(imagenet, cluster.resolve_hosts(imagenet.cluster), CPU).steps_per_epoch == 1281167 // 8 // 32
    validate(imagenet)  # no data.root: a dry run does not read the data
    any_tree = compose("recipe=resnet50_imagenet", "data=imagefolder", "dry_run=true")
    assert any_tree.data.train_size is None
    assert make_plan(any_tree, cluster.resolve_hosts(any_tree.cluster), CPU).steps_per_epoch is None


def test_a_data_set_smaller_than_one_global_batch_is_refused():
    cfg = compose("train.batch_size=1000")
    with pytest.raises(ConfigError) as error:
        make_plan(cfg, cluster.resolve_hosts(cfg.cluster), CPU)
    assert str(error.value) == ("invalid config: data.train_size=1437: 1437 training samples, fewer than one global "
                                "batch (2000 = 2 ranks x train.batch_size=1000 x train.backward_passes_per_step=1)")


def test_dry_run_takes_the_hosts_of_a_slurm_allocation(image_tree):
    result = run_hvdtrain("recipe=resnet101_imagenet", "cluster=2x4", f"data.root={image_tree}", "dry_run=true",
                          "cluster.mpirun_args=[--mca,plm_rsh_agent,/usr/bin/ssh]",
                          env={"SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_TASKS_PER_NODE": "4(x2)"})
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["hosts"] == [{"host": "gpu07", "slots": 4}, {"host": "gpu08", "slots": 4}]
    command = plan["launch_command"]
    assert command[command.index("--mca"):command.index("--mca") + 3] == ["--mca", "plm_rsh_agent", "/usr/bin/ssh"]


BAD_INPUTS = {
    "unknown model": (["model.name=resnet9000"], "model.name='resnet9000': unknown model; allowed: resnet50"),
    "unknown framework": (["recipe.framework=jax"], "recipe.framework='jax': allowed: torch, tensorflow"),
    "negative LR": (["optimizer.base_lr=-0.1"], "optimizer.base_lr=-0.1: must be a positive"),
    "warmup longer than training": (["schedule.warmup_epochs=50"], "schedule.warmup_epochs=50.0: must be between 0 and"),
    "missing data root": (["recipe=resnet50_imagenet"], "data.root is not set"),
    "batch size 0": (["train.batch_size=0"], "train.batch_size=0: must be a positive"),
    "unknown cluster": (["cluster=3-by-7"], "cluster='3-by-7': unknown cluster; allowed: 1x1, 1x2"),  # 3x7 is one
    "multi-host layout without hosts": (["cluster=4x4"], "cluster=4x4 needs 4 hosts but none were given"),
    "too few slots on a host": (["cluster=2x4", "cluster.hosts=[a:4,b:2]"], "host b offers 2"),
    "unknown key": (["train.bach_size=3"], "train.bach_size: unknown key; did you mean train.batch_size?"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gets_one_clear_message_and_launches_nothing(case, tmp_path):
    overrides, message = BAD_INPUTS[case]
    result = run_hvdtrain(*overrides, f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "starting" not in result.stdout and not (tmp_path / "run").exists()


def test_a_bad_progress_bar_setting_gets_a_clear_message_and_launches_nothing(tmp_path):
    result = run_hvdtrain(f"hydra.run.dir={tmp_path / 'run'}", env={"HVDTRAIN_PROGRESS_BAR": "yes"})
    assert result.returncode != 0
    assert "environment variable HVDTRAIN_PROGRESS_BAR must be 0 or 1, got 'yes'" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "starting" not in result.stdout and not (tmp_path / "run").exists()


@pytest.mark.parametrize("terminal", [True, False])
def test_the_workers_draw_a_progress_bar_only_where_the_command_writes_to_a_terminal(terminal, tmp_path,
                                                                                      monkeypatch):
    # mpirun gives the workers a pipe for stderr either way: the command tells them.
    class Stderr(io.StringIO):
        def isatty(self):
            return terminal

    monkeypatch.delenv("HVDTRAIN_PROGRESS_BAR", raising=False)
    monkeypatch.setattr(sys, "stderr", Stderr())
    _, environment = cli._launch_plan(compose(), tmp_path)
    assert environment["HVDTRAIN_PROGRESS_BAR"] == ("1" if terminal else "0")
    assert progress_bar_wanted(environment) is terminal
    monkeypatch.setenv("HVDTRAIN_PROGRESS_BAR", "0")  # the user's choice stands
    _, environment = cli._launch_plan(compose(), tmp_path)
    assert environment["HVDTRAIN_PROGRESS_BAR"] == "0"


MNIST1D = ["recipe=mnist1d"]
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
    "an unknown optimizer": (["optimizer.name=adam"], "optimizer.name='adam': allowed: sgd, lars"),
    "LARS without a trust coefficient": (["optimizer=lars", "optimizer.trust_coefficient=null"],
                                         "optimizer.trust_coefficient=None: must be a positive number"),
    "LARS with tensorflow": (["optimizer=lars", "recipe.framework=tensorflow"],
                             "optimizer.name='lars': LARS is implemented for recipe.framework=torch only"),
    "a LARS key with SGD": (["optimizer.trust_coefficient=0.001"],
                            "optimizer.trust_coefficient=0.001: applies to optimizer=lars only"),
    "an adaptation exclusion with SGD": (["optimizer.exclude_from_adaptation=[bn]"],
                                         "optimizer.exclude_from_adaptation=['bn']: applies to optimizer=lars only"),
    "an unknown kind of parameter": (["optimizer=lars", "optimizer.exclude_from_adaptation=[norm]"],
                                     "optimizer.exclude_from_adaptation=['norm']: allowed entries: bn, bias"),
    "an unknown warmup": (["schedule.warmup=linear"], "schedule.warmup='linear': allowed: gradual, constant, none"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_mnist1d_and_lars_values_that_cannot_run_are_refused_with_the_key(case):
    overrides, problem = REFUSED[case]
    with pytest.raises(ConfigError) as error:
        validate(compose(*overrides))
    assert str(error.value).startswith(f"invalid config: {problem}") and "\n" not in str(error.value)


def test_lars_and_mnist1d_compose_with_their_defaults():
    assert compose("recipe=mnist1d").data.num_samples == 5000  # the paper's data set
    cfg = compose("data=mnist1d", "model=mnist1d_mlp", "optimizer=lars")
    validate(cfg)
    assert (cfg.data.source, cfg.data.num_samples, cfg.data.seed, cfg.model.name) == ("mnist1d", 100000, 42,
                                                                                      "mnist1d_mlp")
    assert cfg.data.cache_dir == str(Path.cwd() / "runs" / ".cache")  # beside the runs of the directory it started in
    assert (cfg.optimizer.name, cfg.optimizer.trust_coefficient) == ("lars", 0.001)
    assert list(cfg.optimizer.exclude_from_adaptation) == ["bn", "bias"]
    assert list(cfg.optimizer.exclude_from_weight_decay) == ["bn", "bias"]


def test_validation_lists_every_problem_at_once():
    cfg = compose("train.batch_size=0", "optimizer.momentum=1.5")
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert "train.batch_size=0" in str(error.value) and "optimizer.momentum=1.5" in str(error.value)


def test_help_lists_the_recipes_and_clusters():
    result = run_hvdtrain("--help")
    assert result.returncode == 0
    assert "recipe: digits" in result.stdout and "4x4" in result.stdout and "dry_run=true" in result.stdout
