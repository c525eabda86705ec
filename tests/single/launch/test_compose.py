"""Composing the config with Hydra, and Hydra's errors as hvdtrain's (hvdtrain/launch/compose.py),
through the `hvdtrain` command run in this process: whatever Hydra or OmegaConf cannot take (an
unknown or misspelt key, a value of the wrong type, an unknown recipe, layout or model, an
override Hydra cannot parse) ends in one line `hvdtrain: invalid config: ...` and exit status 2,
before anything is launched; an unknown recipe lists the recipes in number order; any
HOSTSxSLOTS layout composes without a file of its own. Hydra's own report with HYDRA_FULL_ERROR=1,
and the real exit status of a refusal: tests/parallel/launch/test_compose.py."""

import pytest

from hvdtrain.launch.compose import RECIPES_DIR
from hvdtrain.run.plan import read_plans

from support.commands import hvdtrain_here, no_launch
from support.configs import compose


@pytest.fixture(autouse=True)
def nothing_launched(monkeypatch):
    """hvdtrain runs in this process here: none of it may start a job."""
    no_launch(monkeypatch)


OPTIMIZER_KEYS = ("name, base_lr, base_batch_size, momentum, nesterov, weight_decay, exclude_from_weight_decay, "
                  "momentum_correction, trust_coefficient, exclude_from_adaptation")
TRAIN_KEYS = ", ".join(f"train.{key}" for key in (
    "epochs", "batch_size", "backward_passes_per_step", "autocast", "device", "channels_last", "cudnn_benchmark",
    "seed", "log_every_steps", "eval_every_epochs", "checkpoint_every_steps", "checkpoint_every_s", "keep_checkpoints",
    "preempt_signal"))
LAYOUTS = "1x1, 1x2, 1x4, 1x8, 2x4, 2x8, 4x4, 4x8, 8x8, 16x8, 32x4, 32x8, local, ray, or any HOSTSxSLOTS such as 3x2"

ONE_LINE_ERRORS = {
    "key added with +, misspelt": (["+optimzer.base_lr=0.5"],
                                   "optimzer.base_lr: unknown key; did you mean optimizer.base_lr?"),
    "misspelt key": (["optimzer.base_lr=0.5"], "optimzer.base_lr: unknown key; did you mean optimizer.base_lr?"),
    "key added with +, nothing near": (["+optimizer.bogus=1"],
                                       f"optimizer.bogus: unknown key; the keys of optimizer: {OPTIMIZER_KEYS}"),
    "key deleted with ~, misspelt": (["~train.epoch"], "train.epoch: unknown key; did you mean train.epochs?"),
    "a key of another section": (["train.lr=0.1"],
                                 "train.lr: unknown key; did you mean optimizer.base_lr or schedule.final_lr?"),
    "not an integer": (["train.epochs=abc"], "train.epochs='abc': must be an integer"),
    "not a boolean": (["train.channels_last=maybe"], "train.channels_last='maybe': must be true or false"),
    "not a list": (["optimizer.exclude_from_weight_decay=bn"],
                   "optimizer.exclude_from_weight_decay='bn': must be a list of strings, written [x,y,...]"),
    "a section set to a value": (["train=3"], f"train=3: is a section; set its keys instead: {TRAIN_KEYS}"),
    "unknown layout": (["cluster=3x3x"], f"cluster='3x3x': unknown cluster; allowed: {LAYOUTS}"),
    "not a layout": (["cluster=abc"], f"cluster='abc': unknown cluster; allowed: {LAYOUTS}"),
    "unknown model": (["model=resnet9000"], "model='resnet9000': unknown model; allowed: digits_cnn, digits_mlp, "
                                            "inception_v3, mnist1d_cnn, mnist1d_mlp, resnet50, resnet101, resnet152, "
                                            "vgg16"),
    "unparsable override": (["train.epochs=[1,"], "train.epochs=[1,: cannot be read as an override: no viable "
                                                  "alternative at input '[1,' See https://hydra.cc/docs/1.2/advanced/"
                                                  "override_grammar/basic for details"),
    "a key below a null section": (["recipe=synthetic", "recipe.target.value=3"],
                                   "Unexpected type for root: NoneType"),  # OmegaConf asserts: no key to name
    "unknown key of Hydra's": (["hydra.bogus=1"], "hydra.bogus: not a key of Hydra's config (hvdtrain --cfg hydra "
                                                  "shows them)"),
    "a sweep without -m": (["train.epochs=1,2"], "Ambiguous value for argument 'train.epochs=1,2' 1. To use it as a "
                                                 "list, use key=[value1,value2] 2. To use it as string, quote the "
                                                 "value: key=\\'value1,value2\\' 3. To sweep over it, add --multirun "
                                                 "to your command line"),
    "--cfg job with an unknown layout": (["--cfg", "job", "cluster=3x3x"],
                                         f"cluster='3x3x': unknown cluster; allowed: {LAYOUTS}"),
    "an unknown value in one job of a sweep": (["-m", "train.epochs=1,abc"], "train.epochs='abc': must be an integer"),
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """refusals(case): (what `hvdtrain ARGUMENTS dry_run=true` gives for a case of
    ONE_LINE_ERRORS, the files it left in the directory it ran in), each case run once."""
    seen = {}

    def refusal(case):
        if case not in seen:
            arguments, _ = ONE_LINE_ERRORS[case]
            where = tmp_path_factory.mktemp("refused")
            with pytest.MonkeyPatch.context() as monkeypatch:
                no_launch(monkeypatch)
                result = hvdtrain_here(*arguments, "dry_run=true", monkeypatch=monkeypatch, cwd=where)
            seen[case] = result, [path.name for path in where.rglob("*") if path.is_file()]
        return seen[case]

    return refusal


@pytest.mark.parametrize("case", ONE_LINE_ERRORS)
def test_what_hydra_cannot_take_ends_in_one_line_and_exit_status_2(case, refusals):
    result, _ = refusals(case)
    problem = ONE_LINE_ERRORS[case][1]
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"hvdtrain: invalid config: {problem}\n")


@pytest.mark.parametrize("case", ONE_LINE_ERRORS)
def test_what_hydra_cannot_take_leaves_no_run_directory(case, refusals):
    _, files = refusals(case)
    assert files in ([], ["multirun.yaml"])  # a sweep leaves Hydra's record of what it was asked


@pytest.fixture
def unknown_recipe(tmp_path, monkeypatch):
    """The recipes `hvdtrain recipe=nope` lists, after checking that it refused it in one line."""
    result = hvdtrain_here("recipe=nope", f"hydra.run.dir={tmp_path / 'run'}", monkeypatch=monkeypatch, cwd=tmp_path)
    prefix = "hvdtrain: invalid config: recipe='nope': unknown recipe; allowed: "
    assert result.returncode == 2 and result.stderr.startswith(prefix) and result.stderr.count("\n") == 1
    return result.stderr[len(prefix):].strip().split(", ")


def test_an_unknown_recipe_lists_every_recipe(unknown_recipe):
    assert sorted(unknown_recipe) == sorted(path.stem for path in RECIPES_DIR.glob("*.yaml"))


def test_the_recipes_are_listed_with_their_numbers_in_number_order(unknown_recipe):
    assert unknown_recipe.index("resnet50_imagenet") < unknown_recipe.index("resnet101_imagenet")


def test_a_layout_without_a_file_of_its_own_names_itself():
    cfg = compose("cluster=128x4")
    assert (cfg.cluster.name, cfg.cluster.num_hosts, cfg.cluster.slots) == ("128x4", 128, 4)


@pytest.fixture(scope="module")
def layouts_swept(tmp_path_factory):
    """The plans of `hvdtrain -m recipe=resnet101_synthetic cluster=3x1,128x4,4x4 dry_run=true`."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        result = hvdtrain_here("-m", "recipe=resnet101_synthetic", "cluster=3x1,128x4,4x4", "dry_run=true",
                               monkeypatch=monkeypatch, cwd=tmp_path_factory.mktemp("sweep"))
    assert result.returncode == 0, result.stdout + result.stderr
    return read_plans(result.stdout)


def test_a_sweep_over_layouts_without_files_composes(layouts_swept):
    three, big, _ = layouts_swept
    assert (three["world_size"], three["hosts"]) == (3, [{"host": f"<host{i}>", "slots": 1} for i in range(3)])
    assert big["world_size"] == 512 and big["global_batch_size"] == 512 * 64
    assert big["hosts"] == [{"host": f"<host{i}>", "slots": 4} for i in range(128)]


def test_a_layout_with_a_file_composes_from_it_in_the_same_sweep(layouts_swept):
    assert layouts_swept[2]["world_size"] == 16  # conf/cluster/4x4.yaml
