"""The shipped recipes (hvdtrain/conf/recipe/, listed by hvdtrain/launch/recipes.py): the
published ones are there; each composes and validates with either framework on several
clusters, with the global batch and the peak LR of the linear rule; each header says how to run
it, on what and to what target, and each target names where its number comes from (a published
result, or this project's own bar, never an issue of the project's tracker); the Goyal et al.
recipes take their settings from the paper."""

import functools
import re

import pytest
from omegaconf import OmegaConf

from hvdtrain.launch.compose import RECIPES_DIR
from hvdtrain.run import hosts
from hvdtrain.run.config import ConfigError, validate
from hvdtrain.run.config.recipe import FRAMEWORKS
from hvdtrain.run.devices import CPU
from hvdtrain.run.plan import make_plan

from support.configs import compose

RECIPES = sorted(path.stem for path in RECIPES_DIR.glob("*.yaml"))
CLUSTERS = {"local": [], "1x8": [], "4x4": ["cluster.hosts=[h1,h2,h3,h4]"]}
EVERY_RECIPE = pytest.mark.parametrize("recipe", RECIPES)
EVERY_FRAMEWORK = pytest.mark.parametrize("framework", FRAMEWORKS)


@pytest.fixture(scope="module")
def composed(image_tree):
    """composed(recipe, framework): {layout: the config of the recipe on each of CLUSTERS}, each
    composed once."""
    @functools.cache
    def on_every_cluster(recipe, framework):
        return {layout: compose(f"recipe={recipe}", f"cluster={layout}", f"data.root={image_tree}",
                                f"recipe.framework={framework}", *hosts)
                for layout, hosts in CLUSTERS.items()}

    return on_every_cluster


def runs_with(cfg, framework):
    return not (cfg.optimizer.name == "lars" and framework == "tensorflow")  # a LARS recipe is torch's only


def test_the_published_recipes_are_there():
    assert {"digits", "resnet50_imagenet", "resnet50_imagenet_8k", "resnet101_imagenet", "inception3_imagenet",
            "vgg16_imagenet", "resnet101_synthetic", "inception3_synthetic", "vgg16_synthetic"} <= set(RECIPES)


@EVERY_FRAMEWORK
@EVERY_RECIPE
def test_every_recipe_composes_and_validates_on_several_clusters(composed, recipe, framework):
    for layout, cfg in composed(recipe, framework).items():
        if not runs_with(cfg, framework):
            with pytest.raises(ConfigError, match="LARS is implemented for recipe.framework=torch only"):
                validate(cfg)
            continue
        validate(cfg)
        assert cfg.recipe.name == recipe and cfg.cluster.name == layout and cfg.recipe.framework == framework


@EVERY_FRAMEWORK
@EVERY_RECIPE
def test_every_recipe_plans_the_global_batch_and_peak_lr_of_the_linear_rule(composed, recipe, framework):
    for cfg in composed(recipe, framework).values():
        if not runs_with(cfg, framework):
            continue
        plan = make_plan(cfg, hosts.resolve_hosts(cfg.cluster), CPU)
        assert plan.world_size == cfg.cluster.num_hosts * cfg.cluster.slots
        assert plan.global_batch_size == plan.world_size * cfg.train.batch_size * cfg.train.backward_passes_per_step
        assert plan.peak_lr == pytest.approx(cfg.optimizer.base_lr * plan.global_batch_size / cfg.optimizer.base_batch_size)


@EVERY_FRAMEWORK
@EVERY_RECIPE
def test_every_recipes_target_is_a_validation_accuracy_with_a_source(composed, recipe, framework):
    for cfg in composed(recipe, framework).values():
        target = cfg.recipe.target
        assert target is None or (target.source and target.metric == "val_top1")


@EVERY_RECIPE
def test_every_recipes_header_says_how_to_run_it_on_what_and_to_what_target(recipe):
    header = (RECIPES_DIR / f"{recipe}.yaml").read_text()
    assert "Run:" in header and "Hardware:" in header and "Target:" in header


@EVERY_RECIPE
def test_a_recipes_target_source_mentions_no_issue_number(recipe):
    target = OmegaConf.load(RECIPES_DIR / f"{recipe}.yaml").get("recipe", {}).get("target")
    if target is None:
        pytest.skip("no target")
    assert not re.search(r"\bissues?\b|#\d+", target.source, re.IGNORECASE), target.source


def test_the_default_recipe_says_its_target_is_our_own_bar():
    source = OmegaConf.load(RECIPES_DIR / "digits.yaml").recipe.target.source
    assert source == "hvdtrain's own bar for this recipe, not a published result"


@pytest.fixture(scope="module")
def goyal_8k():
    """resnet50_imagenet_8k on 32 hosts, and its plan."""
    cfg = compose("recipe=resnet50_imagenet_8k", "cluster.hosts=[" + ",".join(f"n{i}" for i in range(32)) + "]")
    return cfg, make_plan(cfg, hosts.resolve_hosts(cfg.cluster), CPU)


def test_the_8k_recipe_trains_goyals_global_batch_at_goyals_lr_and_warmup(goyal_8k):
    _, plan = goyal_8k
    assert (plan.global_batch_size, plan.peak_lr, plan.warmup_epochs) == (8192, 3.2, 5)


def test_the_8k_recipe_decays_at_goyals_milestones_for_90_epochs(goyal_8k):
    cfg, _ = goyal_8k
    assert list(cfg.schedule.milestones) == [30, 60, 80] and cfg.train.epochs == 90


def test_the_8k_recipe_zeroes_the_residual_gammas_and_spares_bn_weight_decay(goyal_8k):
    cfg, _ = goyal_8k
    assert cfg.model.zero_init_residual and list(cfg.optimizer.exclude_from_weight_decay) == ["bn"]


def test_the_8k_recipe_targets_goyals_error(goyal_8k):
    cfg, _ = goyal_8k
    assert cfg.recipe.target.value == pytest.approx(100 - 23.74)


def test_the_baseline_recipe_trains_goyals_reference_batch():
    cfg = compose("recipe=resnet50_imagenet")
    plan = make_plan(cfg, hosts.resolve_hosts(cfg.cluster), CPU)
    assert (plan.global_batch_size, plan.peak_lr) == (256, 0.1)
