"""Every recipe's target names where its number comes from: a published result, or this project's
own bar, never a ticket of the project's tracker that a reader of a summary cannot see."""

import re

import pytest
from omegaconf import OmegaConf

from hvdtrain.launch.compose import RECIPES_DIR

RECIPES = sorted(RECIPES_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=[path.stem for path in RECIPES])
def test_a_recipes_target_source_mentions_no_issue_number(path):
    target = OmegaConf.load(path).get("recipe", {}).get("target")
    if target is None:
        pytest.skip("no target")
    assert not re.search(r"\bissues?\b|#\d+", target.source, re.IGNORECASE), target.source


def test_the_default_recipe_says_its_target_is_our_own_bar():
    source = OmegaConf.load(RECIPES_DIR / "digits.yaml").recipe.target.source
    assert source == "hvdtrain's own bar for this recipe, not a published result"
